"""Stand-in for ``vllm_neuron.utils.dtype_utils``. The real module resolves
the platform at import; the CPU stand-in uses the CPU-mode constants."""

from __future__ import annotations

FP8_CLAMP_MAX = 448.0
QUANTIZED_KV_CACHE_DTYPES = ["fp8", "fp8_e4m3"]


def validate_fp8_segmented_supported(kv_is_fp8: bool, fp8_packed: bool) -> None:
    if kv_is_fp8 and fp8_packed:
        raise NotImplementedError(
            "segmented prefill with a packed FP8 KV cache is not supported"
        )
