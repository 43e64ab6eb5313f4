"""Stand-in for ``vllm.config``: the few fields model code reads from the
current vLLM config (parallel, cache and model settings)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any


@dataclass
class ParallelConfig:
    tensor_parallel_size: int = 1
    data_parallel_size: int = 1
    enable_expert_parallel: bool = False
    cp_kv_cache_interleave_size: int = 1
    decode_context_parallel_size: int = 1


@dataclass
class CacheConfig:
    cache_dtype: str = "auto"
    block_size: int = 128


@dataclass
class ModelConfig:
    model: str = ""
    revision: str | None = None
    runner_type: str = "generate"
    dtype: Any = None


@dataclass
class VllmConfig:
    parallel_config: ParallelConfig = field(default_factory=ParallelConfig)
    cache_config: CacheConfig = field(default_factory=CacheConfig)
    model_config: ModelConfig = field(default_factory=ModelConfig)
    additional_config: dict = field(default_factory=dict)


_CURRENT: VllmConfig = VllmConfig()


def get_current_vllm_config() -> VllmConfig:
    return _CURRENT


@contextlib.contextmanager
def set_current_vllm_config(config: VllmConfig, *args: Any, **kwargs: Any) -> Iterator[None]:
    global _CURRENT
    previous = _CURRENT
    _CURRENT = config
    try:
        yield
    finally:
        _CURRENT = previous


def configure(
    tensor_parallel_size: int,
    model: str = "",
    enable_expert_parallel: bool = False,
    cache_dtype: str = "auto",
    data_parallel_size: int = 1,
    decode_context_parallel_size: int = 1,
    cp_kv_cache_interleave_size: int = 1,
) -> VllmConfig:
    """Set the config the validation run's model sees (``cache_dtype`` is the
    KV-cache dtype name: ``"auto"`` or ``"fp8"``)."""
    global _CURRENT
    _CURRENT = VllmConfig(
        parallel_config=ParallelConfig(
            tensor_parallel_size=tensor_parallel_size,
            data_parallel_size=data_parallel_size,
            enable_expert_parallel=enable_expert_parallel,
            cp_kv_cache_interleave_size=cp_kv_cache_interleave_size,
            decode_context_parallel_size=decode_context_parallel_size,
        ),
        cache_config=CacheConfig(cache_dtype=cache_dtype),
        model_config=ModelConfig(model=model),
    )
    return _CURRENT


def use(config: VllmConfig) -> None:
    """Make ``config`` the current one (the driver switches between the
    prefill and decode graphs' configs)."""
    global _CURRENT
    _CURRENT = config
