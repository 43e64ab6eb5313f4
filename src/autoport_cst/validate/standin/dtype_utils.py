"""Stand-in for ``vllm_neuron.utils.dtype_utils``: the FP8 KV-cache names
and range, and the guard models call before segmented prefill.

The FP8 range follows the platform, as on device: Trainium2 stores
``float8_e4m3`` with infinities (largest finite value 240), Trainium3
``float8_e4m3fn`` (448). On CPU the cache is ``torch.float8_e4m3fn``; values
clamped to 240 are represented exactly as the Trainium2 format holds them.
"""

from __future__ import annotations

import torch

from .neuron_platform import get_platform_target

QUANTIZED_KV_CACHE_DTYPES = ["fp8", "fp8_e4m3"]
KV_CACHE_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "fp8": torch.float8_e4m3fn,
    "fp8_e4m3": torch.float8_e4m3fn,
}


def fp8_clamp_max(target: str | None = None) -> float:
    """Largest finite FP8 value of the platform's KV-cache format."""
    return 448.0 if (target or get_platform_target()).startswith("trn3") else 240.0


FP8_CLAMP_MAX = fp8_clamp_max()


def kv_cache_dtype_str_to_dtype(kv_cache_dtype: str, model_config) -> torch.dtype:
    """``"auto"`` is the model dtype; otherwise a name of ``KV_CACHE_DTYPES``."""
    if kv_cache_dtype == "auto":
        return model_config.dtype
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(
            f"Unsupported kv_cache_dtype '{kv_cache_dtype}' on Neuron. "
            f"Supported values: 'auto', {sorted(KV_CACHE_DTYPES)}"
        )
    return KV_CACHE_DTYPES[kv_cache_dtype]


def validate_fp8_segmented_supported(kv_is_fp8: bool, fp8_packed: bool) -> None:
    """Segmented prefill reads an FP8 K cache only in the packed layout: an
    FP8 cache that is not packed is refused (it serves full prefill only)."""
    if kv_is_fp8 and not fp8_packed:
        raise NotImplementedError(
            "FP8 segmented prefill requires a packed KV cache; the segmented "
            "attention kernel cannot read a non-packed FP8 K cache (non-packed "
            "FP8 serves full prefill only)"
        )
