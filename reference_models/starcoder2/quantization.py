# SPDX-License-Identifier: Apache-2.0
"""Quantization of the Starcoder2 reference: what a checkpoint's
``quantization_config`` asks for, and which attention and MLP classes
serve it.

``QuantizationSpec.from_hf_quantization_config`` turns the config into a
spec (None: not quantized) and refuses formats it does not know, so that a
quantized checkpoint never loads silently as bf16. The decoder layer asks
``resolve_attention_mlp_classes(spec, layer_index)`` for its classes and
``spec.get_scheme(layer_index, prefix)`` for the scheme that decides its FP8
branches (an FP8 attention or MLP fuses the preceding RMSNorm, so the layer
hands it the norm's weight instead of calling the norm).

This reference ships bf16 classes only: without quantization (or with a
scheme of ``NONE``) the resolver returns the classes of ``model.py``; for any
other scheme it raises ``NotImplementedError`` naming the scheme. A package
that adds FP8 classes registers them in ``resolve_attention_mlp_classes``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any


class QuantScheme(str, Enum):
    """How one module's weights (or the KV cache) are stored."""

    NONE = "none"
    # float8_e4m3 weights and activations with one static scale per tensor
    # (NVIDIA ModelOpt "FP8"); for the KV cache, FP8 entries with static scales
    FP8_STATIC_PER_TENSOR = "fp8_static_per_tensor"


@dataclass(frozen=True)
class QuantizationSpec:
    """The schemes a quantized checkpoint uses."""

    linear_scheme: QuantScheme
    kv_cache_scheme: QuantScheme = QuantScheme.NONE

    def get_scheme(self, layer_index: int | None, prefix: str) -> QuantScheme:
        """The scheme of the module ``prefix`` (``"self_attn"``, ``"mlp"``, ...)
        of layer ``layer_index`` (None outside the layers). Every linear module
        shares one scheme today; the arguments let a port dispatch per module."""
        del layer_index, prefix
        return self.linear_scheme

    @classmethod
    def from_hf_quantization_config(cls, quantization_config: dict[str, Any] | None) -> "QuantizationSpec | None":
        """None when the checkpoint is not quantized; raises ``ValueError`` for
        a format this reference does not read."""
        if not quantization_config:
            return None
        if not isinstance(quantization_config, dict):
            raise ValueError(
                f"quantization_config must be a mapping, got {type(quantization_config).__name__}"
            )
        method = str(quantization_config.get("quant_method", "")).lower()
        if method == "modelopt":
            return _modelopt_spec(quantization_config)
        if method == "compressed-tensors":
            # KV-cache scales only (read by load_weights); the weights stay bf16
            return None
        raise ValueError(
            f"quant_method {method!r} is not supported (supported: 'modelopt', 'compressed-tensors')"
        )


def _modelopt_spec(quantization_config: dict[str, Any]) -> QuantizationSpec:
    """ModelOpt writes its settings flat or under ``quantization``."""
    nested = quantization_config.get("quantization")
    settings = nested if isinstance(nested, dict) else quantization_config
    algorithm = str(settings.get("quant_algo", "")).upper()
    if algorithm != "FP8":
        raise ValueError(f"ModelOpt quant_algo {algorithm!r} is not supported (supported: 'FP8')")
    kv_algorithm = str(settings.get("kv_cache_quant_algo") or "").upper()
    kv_scheme = QuantScheme.FP8_STATIC_PER_TENSOR if kv_algorithm == "FP8" else QuantScheme.NONE
    return QuantizationSpec(linear_scheme=QuantScheme.FP8_STATIC_PER_TENSOR, kv_cache_scheme=kv_scheme)


def resolve_attention_mlp_classes(quant_spec: QuantizationSpec | None, layer_index: int) -> tuple[type, type]:
    """``(attention class, MLP class)`` of layer ``layer_index`` (not built)."""
    # model.py imports this module: import it here, when a layer is built
    from . import model as _bf16

    if quant_spec is None:
        return _bf16.Starcoder2Attention, _bf16.Starcoder2MLP
    scheme = quant_spec.get_scheme(layer_index, prefix="self_attn")
    if scheme is QuantScheme.NONE:
        return _bf16.Starcoder2Attention, _bf16.Starcoder2MLP
    raise NotImplementedError(
        f"quantization scheme {scheme.value!r} (layer {layer_index}): this package ships bf16 "
        "attention and MLP classes only; register the classes of that scheme in "
        "resolve_attention_mlp_classes"
    )
