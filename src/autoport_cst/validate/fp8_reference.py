"""The transformers side of an FP8 KV-cache validation.

With ``--kv-cache-dtype fp8`` a port stores K and V in the cache as
``float8_e4m3fn(x * 1/s)`` (``s`` the checkpoint's dequantization scale,
``<attention>.k_scale`` / ``.v_scale``, 1 when it has none; the reciprocal
taken in bfloat16, as the engine loads it) and its decode attention reads
them back, the step's own K/V quantized the same way; the prefill attends
over the fresh, unquantized K/V. transformers has no such cache, so compared
with it as it is, a correct FP8 port fails by the quantisation error alone.

The baseline here does what the port's cache does, at the point every
transformers attention hands its K/V to the cache (``Cache.update``, called
with the layer index by every attention class), whatever the model: the
sequence runs as a prefill of the prompt and one forward per decode step, the
cache stores K/V rounded through the FP8 format with that layer's scales,
and returns them rounded to the decode steps (the prefill gets its fresh
K/V back). A port whose scales are swapped or ignored rounds differently and
fails; a correct one matches to fp32 rounding, but for a value that lies at a
rounding boundary of the FP8 grid, which the two sides may round to either
neighbour: the fp32 run takes the port's stored values there
(``fp8_cache_forcing``, given the port's cache contents).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from .components import ComponentRecorder, find_components
from .fp8_cache_forcing import CacheContents, ForcingTally, column_order, forced_codes
from .reference import ReferenceOutput, last_per_forward

# a scale under an indexed layer (model.layers.<i>.self_attn.k_scale, transformer.h.<i>.attn.v_scale):
# the layer index is the last index segment before it
_SCALE_KEY = re.compile(r"(?:^|\.)(\d+)\.(?:[^.]*[^.\d][^.]*\.)*(k_scale|v_scale)$")


def checkpoint_kv_scales(checkpoint: str | Path) -> dict[tuple[int, str], float]:
    """``{(layer, "k_scale" | "v_scale"): s}`` of the checkpoint's KV-cache
    dequantization scales (absent: 1 at run time)."""
    from safetensors import safe_open

    scales: dict[tuple[int, str], float] = {}
    for path in sorted(Path(checkpoint).glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as handle:
            for name in handle.keys():
                match = _SCALE_KEY.search(name)
                if match:
                    scales[(int(match[1]), match[2])] = float(handle.get_tensor(name).reshape(-1)[0])
    return scales


def fp8_rounded(x: torch.Tensor, scale: float) -> torch.Tensor:
    """``x`` stored in an FP8 KV cache and read back: times the reciprocal
    scale (bfloat16, as loaded), clamped to the platform's range, cast to
    ``float8_e4m3fn``, divided again; in ``x``'s dtype."""
    return _stored(x, scale, None, None)


def _stored(
    x: torch.Tensor, scale: float, port: torch.Tensor | None, tally: ForcingTally | None
) -> torch.Tensor:
    """``x`` stored in the FP8 cache and read back, the stored values
    teacher-forced from ``port`` (the port's, ``x``'s shape, in transformers'
    column order) by ``forced_codes``."""
    inverse = _inverse(scale)
    return (forced_codes(_scaled(x, inverse), port, tally) / inverse).to(x.dtype)


def _inverse(scale: float) -> float:
    """The reciprocal of a dequantization scale, in bfloat16 as the models load it."""
    return float((1.0 / torch.tensor(scale, dtype=torch.bfloat16)).float())


def _scaled(x: torch.Tensor, inverse: float) -> torch.Tensor:
    """``x`` in the cache's units (times the reciprocal scale), clamped to the FP8 range; float32."""
    from .standin.dtype_utils import FP8_CLAMP_MAX

    return (x.to(torch.float32) * inverse).clamp(-FP8_CLAMP_MAX, FP8_CLAMP_MAX)


def _rounding_cache(
    config: Any,
    scales: dict[tuple[int, str], float],
    port: dict[int, tuple[torch.Tensor, torch.Tensor]] | None = None,
    tally: ForcingTally | None = None,
) -> Any:
    """The cache of one sequence; ``port``: the port's stored K/V of that
    sequence per layer (``fp8_cache_forcing``), whose values it takes where
    they are transformers' own up to a rounding boundary, in transformers'
    column order (``column_order``, found on the prefill's rows)."""
    from transformers.cache_utils import DynamicCache

    orders: dict[tuple[int, str], torch.Tensor | None] = {}

    def store(x: torch.Tensor, layer: int, name: str, rows: torch.Tensor | None, start: int) -> torch.Tensor:
        scale = scales.get((layer, name), 1.0)
        if rows is not None:
            if start == 0:
                orders[(layer, name)] = column_order(rows, _scaled(x, _inverse(scale)))
            order = orders.get((layer, name))
            rows = rows[..., order] if order is not None else rows
        return _stored(x, scale, rows, tally)

    class RoundingCache(DynamicCache):
        """Stores K/V rounded through FP8; returns the fresh K/V to the
        forward that fills an empty layer (the prefill), the rounded ones after."""

        def update(self, key_states, value_states, layer_idx, *args, **kwargs):
            start = self.get_seq_length(layer_idx)
            forced = _port_rows(port, layer_idx, start, (key_states, value_states), tally)
            keys, values = super().update(
                store(key_states, layer_idx, "k_scale", forced[0], start),
                store(value_states, layer_idx, "v_scale", forced[1], start),
                layer_idx,
                *args,
                **kwargs,
            )
            return (key_states, value_states) if start == 0 else (keys, values)

    return RoundingCache(config=config)


def _port_rows(
    port: dict[int, tuple[torch.Tensor, torch.Tensor]] | None,
    layer: int,
    start: int,
    states: tuple[torch.Tensor, torch.Tensor],
    tally: ForcingTally | None,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The port's stored K and V of the positions the update brings (``states``,
    ``[1, kv_heads, T, head_dim]`` each), shaped like them; none when the
    port's cache of that layer does not map onto transformers' element-wise."""
    if port is None or layer not in port:
        return None, None
    rows = [
        _per_state_head(t[:, start : start + s.shape[2]].unsqueeze(0), s)
        for t, s in zip(port[layer], states, strict=True)
    ]
    if any(r.shape != s.shape for r, s in zip(rows, states, strict=True)):
        if tally is not None:
            tally.unmatched.add(layer)
        return None, None
    if tally is not None:
        tally.layers.add(layer)
    return rows[0], rows[1]


def _per_state_head(rows: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
    """The port's rows (``[1, kv_heads, T, head_dim]``) laid out as
    transformers' cache holds ``state``: as they are, or each KV head
    repeated for the query heads of its group when transformers' cache holds
    every query head's copy of its group's K/V (Falcon's grouped layout,
    ``new_decoder_architecture``, broadcasts them before the cache in
    transformers 5.24 and keeps the KV heads in 5.25): ``state``'s heads a
    multiple of the port's, the rows of each group identical (what a
    broadcast gives, never distinct heads). Otherwise as they are (their
    shape then does not match and the layer keeps transformers' rounding)."""
    heads, kv_heads = state.shape[1], rows.shape[1]
    if rows.shape == state.shape or kv_heads == 0 or heads % kv_heads or rows.shape[2:] != state.shape[2:]:
        return rows
    groups = state.unflatten(1, (kv_heads, heads // kv_heads))
    if not torch.equal(groups, groups[:, :, :1].expand_as(groups)):
        return rows
    return rows.repeat_interleave(heads // kv_heads, dim=1)


def run_fp8_cache_reference(
    model: Any,
    prompts: tuple[tuple[int, ...], ...],
    teacher: list[list[int]],
    scales: dict[tuple[int, str], float],
    port: CacheContents | None = None,
    tally: ForcingTally | None = None,
) -> ReferenceOutput:
    """``run_reference`` with the port's FP8 cache: per sequence a prefill
    forward of the prompt and one forward per teacher token, the components'
    rows of each sequence gathered in position order. ``port``: the port's
    stored K/V per sequence, the cache teacher-forced from them
    (``fp8_cache_forcing``), counted into ``tally``."""
    components = find_components(model)
    recorder = ComponentRecorder(model, components)
    logits: list[torch.Tensor] = []
    grouped: dict[str, list[torch.Tensor]] = {}
    try:
        with torch.no_grad():
            for sequence, (prompt, generated) in enumerate(zip(prompts, teacher, strict=False)):
                forced = port.get(sequence) if port is not None else None
                cache = _rounding_cache(model.config, scales, forced, tally if forced else None)
                before = {name: len(entries) for name, entries in recorder.records.items()}
                inputs = [list(prompt)] + [[token] for token in generated]
                rows = []
                for step, ids in enumerate(inputs):
                    recorder.set_tag((sequence, step))  # a module applied twice in a forward: its last
                    rows.append(model(input_ids=torch.tensor([ids]), cache=cache, use_cache=True))
                logits.append(torch.cat([r.logits[0].detach().clone() for r in rows]))
                for name, entries in recorder.records.items():
                    new = [
                        t.reshape(-1, t.shape[-1]) for t in last_per_forward(entries[before.get(name, 0) :])
                    ]
                    grouped.setdefault(name, []).append(torch.cat(new))
    finally:
        recorder.remove()
    return ReferenceOutput(logits, components, grouped)


def fp8_cache_runner(checkpoint: str | Path) -> Callable[..., ReferenceOutput]:
    """``run(model, prompts, teacher)`` with the checkpoint's KV-cache scales."""
    return functools.partial(run_fp8_cache_reference, scales=checkpoint_kv_scales(checkpoint))
