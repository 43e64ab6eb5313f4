"""Stand-in for ``vllm_neuron.model.neuron_config``: the serving options a
model reads (every read must also accept ``neuron_config is None``)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any


@dataclass
class OnDeviceSamplingConfig:
    """vllm_neuron's fields (``OnDeviceSamplingConfig(**kwargs)``, unknown
    keys ignored): greedy only when ``all_greedy``; otherwise each request's
    ``sampling_params`` decide."""

    all_greedy: bool = False
    max_top_k: int = 256
    deterministic: bool = False
    sampling_dp_degree: int = 1
    capture_topk: bool = False

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> OnDeviceSamplingConfig:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in names})


@dataclass
class NeuronConfig:
    quantization: str | None = None
    ep_degree: int = 1
    attention_dp_size: int = 1
    embedding_dp_size: int = 1
    lm_head_dp_size: int = 1
    mlp_dp_size: int = 1
    on_device_sampling_config: OnDeviceSamplingConfig | None = field(default_factory=OnDeviceSamplingConfig)
    max_logprobs: int = 0
    debug_logits_dir: str | None = None
    fp8_packed_kv: bool = False
    apply_prefill_dcp: bool = False
    num_batched_tokens_buckets: list[int] = field(default_factory=list)
    num_seqs_buckets: list[int] = field(default_factory=list)

    @classmethod
    def from_dict(cls, values: dict[str, Any] | None) -> NeuronConfig:
        values = dict(values or {})
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise ValueError(f"unknown NeuronConfig field(s): {', '.join(unknown)}")
        ods = values.get("on_device_sampling_config", {})
        if isinstance(ods, dict):
            values["on_device_sampling_config"] = OnDeviceSamplingConfig.from_dict(ods)
        return cls(**values)
