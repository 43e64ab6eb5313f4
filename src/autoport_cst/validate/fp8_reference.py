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
fails; a correct one matches to fp32 rounding.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from .components import ComponentRecorder, find_components
from .reference import ReferenceOutput

_SCALE_KEY = re.compile(r"(?:^|\.)layers\.(\d+)\.(?:[^.]+\.)*(k_scale|v_scale)$")


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
    from .standin.dtype_utils import FP8_CLAMP_MAX

    inverse = float((1.0 / torch.tensor(scale, dtype=torch.bfloat16)).float())
    stored = (x.to(torch.float32) * inverse).clamp(-FP8_CLAMP_MAX, FP8_CLAMP_MAX).to(torch.float8_e4m3fn)
    return (stored.to(torch.float32) / inverse).to(x.dtype)


def _rounding_cache(config: Any, scales: dict[tuple[int, str], float]) -> Any:
    from transformers.cache_utils import DynamicCache

    class RoundingCache(DynamicCache):
        """Stores K/V rounded through FP8; returns the fresh K/V to the
        forward that fills an empty layer (the prefill), the rounded ones after."""

        def update(self, key_states, value_states, layer_idx, *args, **kwargs):
            first = self.get_seq_length(layer_idx) == 0
            keys, values = super().update(
                fp8_rounded(key_states, scales.get((layer_idx, "k_scale"), 1.0)),
                fp8_rounded(value_states, scales.get((layer_idx, "v_scale"), 1.0)),
                layer_idx,
                *args,
                **kwargs,
            )
            return (key_states, value_states) if first else (keys, values)

    return RoundingCache(config=config)


def run_fp8_cache_reference(
    model: Any,
    prompts: tuple[tuple[int, ...], ...],
    teacher: list[list[int]],
    scales: dict[tuple[int, str], float],
) -> ReferenceOutput:
    """``run_reference`` with the port's FP8 cache: per sequence a prefill
    forward of the prompt and one forward per teacher token, the components'
    rows of each sequence gathered in position order."""
    components = find_components(model)
    recorder = ComponentRecorder(model, components)
    logits: list[torch.Tensor] = []
    grouped: dict[str, list[torch.Tensor]] = {}
    try:
        with torch.no_grad():
            for prompt, generated in zip(prompts, teacher, strict=False):
                cache = _rounding_cache(model.config, scales)
                before = {name: len(entries) for name, entries in recorder.records.items()}
                inputs = [list(prompt)] + [[token] for token in generated]
                rows = [model(input_ids=torch.tensor([ids]), cache=cache, use_cache=True) for ids in inputs]
                logits.append(torch.cat([r.logits[0].detach().clone() for r in rows]))
                for name, entries in recorder.records.items():
                    new = [t.reshape(-1, t.shape[-1]) for _tag, t in entries[before.get(name, 0) :]]
                    grouped.setdefault(name, []).append(torch.cat(new))
    finally:
        recorder.remove()
    return ReferenceOutput(logits, components, grouped)


def fp8_cache_runner(checkpoint: str | Path) -> Callable[..., ReferenceOutput]:
    """``run(model, prompts, teacher)`` with the checkpoint's KV-cache scales."""
    return functools.partial(run_fp8_cache_reference, scales=checkpoint_kv_scales(checkpoint))
