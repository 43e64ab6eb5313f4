"""What a checkpoint allows a serving run: the context length and the TP
size, read from its ``config.json`` values without importing vLLM.

- **Positions**: the longest context the config declares
  (``max_position_embeddings`` and the other names vLLM reads, at the top or
  in ``text_config``); a run asking for more is refused (vLLM's own check
  can be overridden, and a port fed positions past its tables fails or
  computes garbage).
- **TP**: a size the tensor-parallel rules accept
  (``research.parallelism.tp_refusal``: heads, KV heads, intermediate size
  and heads per rank); vLLM accepts some sizes the port's sharding does not
  (4 ranks over 4 heads and 2 KV heads), which would fail inside the engine.

``serving_limits`` gives the run's (TP, context length): each value asked
for, checked, or without one the default that fits the checkpoint (the
preferred value when it fits, else the largest that does). The smoke test,
``port --serve`` and the stand-in platform (for ``run.py`` and any other
``LLM``/server start under ``AUTOPORT_STANDIN=1``) use it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autoport_cst.errors import InputError

# the config keys vLLM derives its maximum context length from
POSITION_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)


# the KV-cache dtypes the stand-in serves: the model's, and FP8 as vllm_neuron
# names it (stored as float8_e4m3fn, unpacked, as validate --kv-cache-dtype fp8)
FP8_CACHE_DTYPES = ("fp8", "fp8_e4m3")
CACHE_DTYPES = ("auto", *FP8_CACHE_DTYPES)


@dataclass(frozen=True)
class ServingLimits:
    tp: int
    max_model_len: int


def checkpoint_positions(config: dict[str, Any]) -> int | None:
    """The longest context the config declares (the smallest of the keys it
    sets, as vLLM takes it), or None when it declares none."""
    found = []
    for values in (config, config.get("text_config") or {}):
        if not isinstance(values, dict):
            continue
        for key in POSITION_KEYS:
            value = values.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
                found.append(int(value))
    return min(found) if found else None


def accepted_tp(config: dict[str, Any], preferred: int) -> int:
    """``preferred`` when the tensor-parallel rules accept it, else the
    largest size below it they accept (1 always is)."""
    from autoport_cst.research.parallelism import tp_refusal

    for tp in range(max(preferred, 1), 1, -1):
        if tp_refusal(config, tp) is None:
            return tp
    return 1


def check_serving_tp(config: dict[str, Any], tp: int, source: str) -> None:
    from autoport_cst.research.parallelism import tp_refusal

    if tp < 1:
        raise InputError(f"--tp must be at least 1, got {tp}")
    refusal = tp_refusal(config, tp)
    if refusal is not None:
        raise InputError(f"--tp {tp}: {refusal} (sizes from {source})")


def check_context_length(config: dict[str, Any], max_model_len: int, source: str) -> None:
    positions = checkpoint_positions(config)
    if max_model_len < 1:
        raise InputError(f"--max-model-len must be at least 1, got {max_model_len}")
    if positions is not None and max_model_len > positions:
        raise InputError(
            f"--max-model-len {max_model_len} exceeds the checkpoint's {positions} positions "
            f"({source}); give --max-model-len {positions} or less"
        )


def serving_limits(
    config: dict[str, Any],
    source: str,
    *,
    tp: int | None = None,
    max_model_len: int | None = None,
    preferred_tp: int = 1,
    preferred_len: int = 2048,
) -> ServingLimits:
    """The run's TP and context length: those asked for, checked against the
    checkpoint (``InputError`` naming the limit), or the defaults that fit
    it (``preferred_*`` when they do)."""
    if tp is None:
        tp = accepted_tp(config, preferred_tp)
    check_serving_tp(config, tp, source)
    if max_model_len is None:
        positions = checkpoint_positions(config)
        max_model_len = preferred_len if positions is None else min(preferred_len, positions)
    check_context_length(config, max_model_len, source)
    return ServingLimits(tp, max_model_len)


def check_cache_dtype(cache_dtype: str, prefix_caching: bool, chunk_tokens: int, max_model_len: int) -> None:
    """A KV-cache dtype the stand-in serves, in a run it can serve with it: an
    FP8 cache is stored unpacked, and the segmented prefill a chunk after
    cached tokens takes reads only a packed FP8 cache (vllm_neuron refuses
    it), so FP8 runs without prefix caching and with every prompt prefilled
    in one chunk (``max_num_batched_tokens`` >= ``max_model_len``)."""
    if cache_dtype not in CACHE_DTYPES:
        raise InputError(
            f"--kv-cache-dtype {cache_dtype}: the stand-in serves {', '.join(CACHE_DTYPES)} "
            "(FP8 as float8_e4m3fn, as vllm_neuron stores it)"
        )
    if cache_dtype not in FP8_CACHE_DTYPES:
        return
    if prefix_caching:
        raise InputError(
            f"--kv-cache-dtype {cache_dtype} with prefix caching: a prefix-cache hit is a segmented "
            "prefill, which reads only a packed FP8 cache; add --no-enable-prefix-caching"
        )
    if chunk_tokens < max_model_len:
        raise InputError(
            f"--kv-cache-dtype {cache_dtype} with --max-num-batched-tokens {chunk_tokens} < --max-model-len "
            f"{max_model_len}: a prompt prefilled in chunks takes segmented prefill, which reads only a "
            "packed FP8 cache; give --max-num-batched-tokens of at least the model length"
        )
