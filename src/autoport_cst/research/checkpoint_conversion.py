"""Tensors transformers splits at load time. A model type's checkpoint
conversion (transformers' ``conversion_mapping``: applied by
``from_pretrained``, reverted by ``save_pretrained``) can chunk one stored
tensor into several of the modules the code builds: HRM-Text stores
``mlp.gate_up_proj`` (chunked into ``mlp.gate_proj`` and ``mlp.up_proj``)
and ``attn.gqkv_proj`` (chunked into the attention's output gate, q, k and
v). A checkpoint in that format holds the fused tensor whatever the code's
module tree shows, so the layout is read from the conversion: fused when the
chunks are exactly the spec's fused rows in order ([gate | up], [q | k | v]),
else not describable (unknown), never "separate"."""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Split:
    """One stored tensor (``source``, transformers' pattern) chunked along
    ``dim`` 0 into ``targets`` (the code's module paths, relative, in the
    order of the chunks); ``plain``: the chunks are taken as they are
    (no interleaving or permutation besides)."""

    source: str
    targets: tuple[str, ...]
    plain: bool

    def describe(self) -> str:
        how = "chunked" if self.plain else "chunked and rearranged"
        return (
            f"transformers' checkpoint conversion: the stored {self.source} is {how} into "
            f"{', '.join(self.targets)} at load"
        )


def _conversions(model_type: str | None, architecture: str | None) -> list:
    try:
        from transformers.conversion_mapping import get_checkpoint_conversion_mapping
    except ImportError:  # an older transformers: no load-time conversion
        return []
    for name in (architecture, model_type):
        if name:
            found = get_checkpoint_conversion_mapping(name)
            if found:
                return list(found)
    return []


def _matches(pattern: str, path: str) -> bool:
    try:
        return re.search(pattern, path) is not None
    except re.error:
        return pattern in path


def _name(pattern: str) -> str:
    """The module path a target pattern names (``mlp.gate_proj`` of
    ``\\.mlp\\.gate_proj\\.weight``)."""
    return pattern.replace("\\.", ".").strip(".").removesuffix(".weight").strip(".")


def same_modules(split: Split, wanted: list[str]) -> bool:
    """The chunks are exactly the modules ``wanted`` (the code's relative
    paths), in that order."""
    return len(split.targets) == len(wanted) and all(
        t == w or t.endswith("." + w) or w.endswith("." + t)
        for t, w in zip(split.targets, wanted, strict=True)
    )


def split_of(model_type: str | None, architecture: str | None, modules: list[str]) -> Split | None:
    """The load-time split whose chunks include weights of ``modules``
    (module paths of the code), or None."""
    for conversion in _conversions(model_type, architecture):
        operations = [type(op).__name__ for op in getattr(conversion, "operations", None) or ()]
        sources = list(getattr(conversion, "source_patterns", None) or ())
        targets = list(getattr(conversion, "target_patterns", None) or ())
        if "Chunk" not in operations or len(sources) != 1 or len(targets) < 2:
            continue
        if any(_name(t).endswith(".bias") for t in targets):
            continue
        if any(_matches(t, f"{m}.weight") for t in targets for m in modules):
            return Split(
                sources[0].replace("\\.", "."), tuple(_name(t) for t in targets), operations == ["Chunk"]
            )
    return None
