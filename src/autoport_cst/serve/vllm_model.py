"""The class vLLM's model registry holds for a port's architecture.

vLLM inspects a registered class for what the model supports (text
generation, no multimodal inputs, no pooling) before any worker starts. The
worker never builds it: ``runner.StandinModelRunner`` builds the port itself
through the port's registry, as the Neuron model runner does.
"""

from __future__ import annotations

import torch
from torch import nn


class PortedForCausalLM(nn.Module):
    """A text-generation model to vLLM's inspection; never instantiated."""

    def __init__(self, *, vllm_config: object, prefix: str = "") -> None:
        raise RuntimeError(
            "autoport-cst: a port is built by the stand-in worker through its registry, "
            "not by vLLM's model loader (is the platform StandinPlatform? AUTOPORT_STANDIN=1)"
        )

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, **kwargs: object) -> torch.Tensor:
        raise NotImplementedError

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
        raise NotImplementedError
