"""A vocabulary the port cannot shard over the run's ranks.

A port that shards the vocabulary without padding it (the real vllm_neuron
llama3: its LM head a ``ColumnParallelLinear`` over ``config.vocab_size``, its
embedding loaded with no ``pad_shard``; the real qwen3: its LM head;
``autoport_cst.transform.anatomy.vocab_shards``) builds and loads only where
each such group divides the vocabulary; vllm_neuron's layers refuse other
sizes on device as the stand-in's do. A run at such a size is bad input
(``InputError``, exit 2), refused before any rank process starts and naming
the site, not a port that fails at build or load: the port computes nothing
wrong, its code cannot take that size with that vocabulary. A site is
sharded over the TP group in the prefill graph, and over TP x its
component's DP degree in the decode graph when the file takes that
component's TP group; a default validation reports such a parallel layout as
not run, with this reason."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import libcst as cst

from autoport_cst.errors import InputError
from autoport_cst.transform.anatomy.vocab_shards import (
    LINEAR,
    LOADER,
    UnpaddedShards,
    takes_group,
    unpadded_shards,
)

SITES = {"lm_head": "LM head", "embedding": "embedding loader"}
DP_LABELS = {"lm_head": "LM-head", "embedding": "embedding"}


def vocabulary_of(config: dict) -> int | None:
    """The config's vocabulary size (a multimodal config's text model's)."""
    for values in (config, config.get("text_config")):
        if isinstance(values, dict):
            size = values.get("vocab_size")
            if isinstance(size, int) and not isinstance(size, bool):
                return size
    return None


def unpadded_site(package_dir: str | Path) -> tuple[str, UnpaddedShards] | None:
    """The first site of the package that shards the vocabulary unpadded
    (its file name and the site), or None: every site pads."""
    for path in sorted(Path(package_dir).glob("*.py")):
        sites, _ = _sites(path.read_text(encoding="utf-8", errors="replace"))
        if sites:
            return path.name, sites[0]
    return None


def unpadded_sites_named(files: dict[str, str]) -> str | None:
    """The sites of a package's ``files`` (relative path -> text) that shard
    the vocabulary unpadded, in words (``its LM head (model.py:674:9)``), or
    None: every site pads."""
    named = [
        f"its {SITES[site.component]} ({name}:{site.line}:{site.column})"
        for name, text in sorted(files.items())
        if name.endswith(".py")
        for site in _sites(text)[0]
    ]
    return ", ".join(named) or None


def check_vocabulary_shards(package_dir: str | Path, checkpoint: Path, config: dict, layout: Any) -> None:
    """``InputError`` when the ranks of ``layout`` (a ``ParallelLayout``)
    cannot shard the checkpoint's vocabulary as the port's code does
    (``vocabulary_refusal``)."""
    dp = {"lm_head": layout.lm_head_dp, "embedding": layout.embedding_dp}
    refusal = vocabulary_refusal(package_dir, config, layout.tp, dp)
    if refusal is not None:
        raise InputError(f"{refusal} (sizes from {Path(checkpoint) / 'config.json'})")


def vocabulary_refusal(
    package_dir: str | Path, config: dict, tp: int, dp: dict[str, int] | None = None, for_port: bool = False
) -> str | None:
    """Why the port in ``package_dir`` cannot shard the vocabulary of
    ``config`` at ``tp`` with the DP degrees ``dp`` (``{"lm_head": 2}``), or
    None; the remedy named is a validation's, or with ``for_port`` a port's
    (the model's own vocabulary: another --tp)."""
    vocab = vocabulary_of(config)
    dp = dp or {}
    if vocab is None or tp * max(dp.values(), default=1) == 1:
        return None
    failing: list[tuple[str, int]] = []  # each site in words, and the ranks it is sharded over
    for path in sorted(Path(package_dir).glob("*.py")):
        sites, groups = _sites(path.read_text(encoding="utf-8", errors="replace"))
        for site in sites:
            degree = dp.get(site.component, 1)
            wide = degree > 1 and site.component in groups
            shards = tp * degree if wide else tp
            if vocab % shards:
                ranks = f"TP {tp} x {DP_LABELS[site.component]} DP {degree}" if wide else f"TP {tp}"
                where = f"{path.name}:{site.line}:{site.column}: {site.what}"
                failing.append(
                    (f"its {SITES[site.component]} ({where}) over {shards} ranks ({ranks})", shards)
                )
    if not failing:
        return None
    shards = max(n for _, n in failing)
    architecture = (config.get("architectures") or ["ARCH"])[0]
    remedy = (
        f"port at a --tp that divides {vocab}"
        if for_port
        else f"run at a size that divides {vocab}, or validate on a checkpoint whose vocabulary {shards} divides "
        f"(autoport-cst tiny {architecture} DIR --set vocab_size=N)"
    )
    return (
        f"the port shards the vocabulary of {vocab} unpadded where the ranks do not divide it: "
        f"{'; '.join(text for text, _ in failing)}; vllm_neuron refuses that on device too: {remedy}"
    )


@functools.lru_cache(maxsize=32)
def _sites(text: str) -> tuple[tuple[UnpaddedShards, ...], frozenset[str]]:
    """The unpadded sites of a file's text and the components whose TP group
    it takes, parsed once per text (a validation checks every run, parallel
    layouts included)."""
    if LINEAR not in text and LOADER not in text:
        return (), frozenset()
    try:
        module = cst.parse_module(text)
    except cst.ParserSyntaxError:
        return (), frozenset()  # importing the port reports it
    sites = tuple(unpadded_shards(module))
    components = {site.component for site in sites}
    return sites, frozenset(c for c in components if takes_group(module, c))
