"""The decode-context-parallel layouts a default validation runs, for a port
whose reference takes decode context parallelism (DCP).

With DCP the ranks of a DCP group hold interleaved shares of each
sequence's KV cache; a decode step attends over each rank's share and merges
the partial results across the group (``get_dcp_group``, the local filled
slots and the active-token owner of the decode mask). No other layout runs
that code: at DCP 1 the groups are of one rank and the merge is the
identity. So a port whose reference declares DCP (``declared_dcp``: a call of
``get_dcp_group`` in the code of the reference it was applied from, read as
``reference_source.reference_of`` reads it, never from the mutable port
alone) is validated, after the other layouts, at (``DCP_LAYOUTS``):

- ``TP=4, DCP 2`` (decode graph only; the prefill graph is plain TP and
  hands its KV cache to the DCP ranks' shares), on a checkpoint with 8
  attention heads and 2 KV heads (each KV head held by both ranks of a DCP
  group, as vllm_neuron's DCP needs: ``num_key_value_heads x dcp <= tp``);
- ``TP=2, DCP 2 with a context-parallel prefill`` (``apply_prefill_dcp``,
  when the reference reads it): the prefill graph runs context-parallel too,
  on a checkpoint with 4 heads and 1 KV head.

The validated checkpoint is used when it can take the layout, else a tiny
checkpoint of its config with those heads
(``parallel_checks.run_on_stand_in``). A port that refuses the layout with a
``NotImplementedError`` of its own (a sliding-window layer: the kernel's
context-parallel decode mask takes no window) is reported as not run, as
is a config without fewer KV heads than heads to give it (multi-head
attention). A checkpoint whose ``layer_types`` mix full attention with
another kind (Gemma 2's sliding layers) refuses DCP decode at its first
sliding layer, before any full-attention layer runs it; so each of those
layouts runs once more on a tiny checkpoint of its config with every layer
full attention (``layer_types`` all ``full_attention``), which drives the
full-attention layers' DCP code (the context-parallel mask and merge, and
the context-parallel prefill).
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .parallel_checks import StandIns

DECODE = ("TP=4, DCP 2", {"tp": 4, "dcp": 2}, {"num_attention_heads": 8, "num_key_value_heads": 2})
PREFILL = (
    "TP=2, DCP 2 with a context-parallel prefill",
    {"tp": 2, "dcp": 2, "prefill_dcp": True},
    {"num_attention_heads": 4, "num_key_value_heads": 1},
)
DCP_LAYOUTS = (DECODE, PREFILL)
FULL_ATTENTION = "full_attention"


def declared_dcp(package_dir: str | Path) -> tuple[str, bool] | None:
    """(where the port's reference declares DCP, whether it reads
    ``apply_prefill_dcp`` too), or None: the port is not asked."""
    from .reference_source import reference_of

    source, directory = reference_of(package_dir)
    for path in sorted(directory.glob("*.py")):
        found = _declared_in(str(path), path.stat().st_mtime_ns)
        if found is not None:
            return f"{source} ({path.name})", found
    return None


@functools.lru_cache(maxsize=32)
def _declared_in(path: str, _mtime: int) -> bool | None:
    """None when the module at ``path`` calls no ``get_dcp_group``, else
    whether it reads ``apply_prefill_dcp``."""
    try:
        tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return None
    names = {
        node.id if isinstance(node, ast.Name) else node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Name | ast.Attribute)
    }
    if "get_dcp_group" not in names:
        return None
    return "apply_prefill_dcp" in names


def dcp_runs(
    package_dir: str | Path,
    validate_on: Callable[..., Any],
    checkpoint: str | Path,
    stand_ins: StandIns | None = None,
) -> list[tuple[str, Callable[[], Any]]]:
    """(label, run) of each layout of ``DCP_LAYOUTS`` the port's reference
    declares, for ``parallel_checks.check_parallel_layouts``
    (``validate_on(checkpoint, **options) -> ValidationReport``; the stand-in
    checkpoints kept in ``stand_ins`` when given)."""
    declared = declared_dcp(package_dir)
    if declared is None:
        return []
    layouts = DCP_LAYOUTS if declared[1] else (DECODE,)
    variants: list[tuple[str, dict[str, Any] | None]] = [("", None)]
    if _mixes_layer_types(checkpoint):
        variants.append((", every layer full attention", {"layer_types": [FULL_ATTENTION]}))
    return [
        (
            f"{label}{suffix}",
            functools.partial(_run, validate_on, checkpoint, options, heads, stand_ins, edits),
        )
        for suffix, edits in variants
        for label, options, heads in layouts
    ]


def _run(
    validate_on: Callable[..., Any],
    checkpoint: str | Path,
    options: dict,
    heads: dict,
    stand_ins: StandIns | None,
    edits: dict[str, Any] | None = None,
) -> Any:
    from .parallel_checks import run_on_stand_in

    takes = functools.partial(_takes, options)
    return run_on_stand_in(validate_on, checkpoint, options, heads, takes, stand_ins, edits)


def _mixes_layer_types(checkpoint: str | Path) -> bool:
    """Whether the checkpoint's ``layer_types`` hold full attention and another kind."""
    from autoport_cst.config_json import parse_config_text

    try:
        config = parse_config_text((Path(checkpoint) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    kinds = config.get("layer_types") if isinstance(config, dict) else None
    return isinstance(kinds, list) and FULL_ATTENTION in kinds and any(k != FULL_ATTENTION for k in kinds)


def _takes(options: dict, config: dict) -> bool:
    """Whether a checkpoint of ``config`` can take the layout of ``options``
    itself (the layout rules and the tensor-parallel rules)."""
    from autoport_cst.errors import InputError
    from autoport_cst.research.parallelism import config_dims, tp_refusal

    from .layout import ParallelLayout, check_layout

    if config_dims(config) is None:  # head counts under no name the checks know: not taken as fitting
        return False
    try:
        check_layout(ParallelLayout(**options), config, max_world=options["tp"])
    except InputError:
        return False
    return tp_refusal(config, options["tp"]) is None
