"""Transformers' two key formats of an architecture's checkpoint tensors.

Transformers 5 loads a checkpoint under its module tree's names (the
"model" key format) and renames or fuses some tensors on the way: a
``save_pretrained`` checkpoint (the "saved" key format, what the hub holds)
names them as the conversion mapping of the model reverts them (GPT-NeoX's
``embed_out`` for ``lm_head``, HY-V3's ``mlp.router.gate`` for ``mlp.gate``,
per-expert tensors for the fused experts). A port researched on one format
must load the other.

:func:`key_format_renames` derives, from transformers' own conversion of the
architecture (``revert_weight_conversion``, the machinery
``validate.tiny.in_key_format`` writes the saved format with), the pairs
``(model tail, saved tail)`` of the keys that differ, each tail the key after
its layer index (``mlp.gate.weight``), ``*`` for an expert's index. Fused
expert tensors pair the per-expert names of both formats
(``mlp.experts.*.gate_proj.weight`` with ``block_sparse_moe.experts.*.w1.weight``),
the port's per-expert layout keys being the canonical names. Nothing is
keyed by model name: an architecture whose conversion renames nothing has no
pairs.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from autoport_cst.errors import InputError


@lru_cache(maxsize=64)
def key_format_renames(architecture: str) -> tuple[tuple[str, str], ...]:
    """``(model tail, saved tail)`` of every tensor transformers names
    differently in its two key formats, for ``architecture`` (a transformers
    class name); empty when transformers cannot build it here."""
    try:
        model = _meta_model(architecture)
    except (InputError, ImportError, ValueError, TypeError, AttributeError, RuntimeError):
        return ()
    return tuple(sorted(set(_pairs(model))))


def _meta_model(architecture: str) -> Any:
    """The architecture on the meta device, at its tiny config (the names do
    not depend on the sizes)."""
    import torch

    from autoport_cst.validate.tiny import _tiny_config

    config, _, model_class = _tiny_config(architecture, None)
    with torch.device("meta"):
        return model_class(config)


def _pairs(model: Any) -> list[tuple[str, str]]:
    """The pairs of ``model``'s tensors, each checked on a random tensor: a
    rename keeps the values, a per-expert split gives expert 0's rows of the
    fused tensor in order (a pair whose values move otherwise, a transposed
    or permuted layout, is left out: such a key is refused at load by name)."""
    import torch
    from transformers.core_model_loading import revert_weight_conversion

    pairs: list[tuple[str, str]] = []
    seen: set[str] = set()
    generator = torch.Generator().manual_seed(0)
    for key, meta in model.state_dict().items():
        tail = layer_tail(key)
        if tail in seen or not meta.is_floating_point():
            continue
        seen.add(tail)
        tensor = torch.randn(meta.shape, generator=generator)
        saved = revert_weight_conversion(model, {key: tensor})
        if list(saved) == [key]:
            continue
        if len(saved) == 1:
            ((name, value),) = saved.items()
            if torch.equal(value, tensor):
                pairs.append((tail, layer_tail(name)))
        else:
            pairs.extend(_expert_pairs(tail, tensor, saved))
    return pairs


def layer_tail(key: str) -> str:
    """The key after its first index segment (its layer), the whole key when
    it has none."""
    parts = key.split(".")
    first = next((i for i, part in enumerate(parts) if part.isdigit()), None)
    return key if first is None else ".".join(parts[first + 1 :])


def _expert_pairs(fused_tail: str, fused: Any, saved: dict) -> list[tuple[str, str]]:
    """A fused expert tensor (``<block>.gate_up_proj``, ``[experts, rows,
    in]``) saved one tensor per expert and projection: the canonical
    per-expert names (``<block>.*.gate_proj.weight``, ``<block>.*.up_proj.weight``)
    paired with the saved ones of expert 0 (its index made ``*``), in the
    order of their rows in the fused tensor. None when the two do not line up."""
    import torch

    block, _, leaf = fused_tail.rpartition(".")
    roles = leaf.split("_")
    if not block or roles[-1:] != ["proj"] or len(roles) < 2 or fused.dim() != 3:
        return []
    canonical = [f"{block}.*.{role}_proj.weight" for role in roles[:-1]]
    first = {
        star: value for key, value in saved.items() if (star := _expert_star(layer_tail(key))) is not None
    }
    if len(first) != len(canonical):
        return []
    rows = fused[0].chunk(len(canonical), dim=0)
    if not all(torch.equal(value, row) for value, row in zip(first.values(), rows, strict=True)):
        return []
    return [(model, kept) for model, kept in zip(canonical, first, strict=True) if model != kept]


def _expert_star(tail: str) -> str | None:
    """``tail`` with its index segment (the expert) made ``*``; None for an
    expert other than 0, or no index."""
    parts = tail.split(".")
    index = next((i for i, part in enumerate(parts) if part.isdigit()), None)
    if index is None or parts[index] != "0":
        return None
    return ".".join([*parts[:index], "*", *parts[index + 1 :]])
