"""The components compared between a port and the transformers model, found
structurally in both (no per-model tables): the token embedding; per decoder
layer the input norm, in a multi-latent attention its normed query and KV
latents, the attention, post-attention norm, MLP and the layer's output (the
residual stream); the final norm; and the logits.

Both model families keep the Hugging Face names (``model.embed_tokens``,
``model.layers.N.self_attn``, ``model.layers.N.mlp``, ``model.norm``); other
common spellings (``transformer.wte``, ``h``, ``attn``, ``ln_f``...) are also
recognised.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

BACKBONE_NAMES = ("model", "transformer", "gpt_neox", "backbone", "language_model")
EMBEDDING_NAMES = ("embed_tokens", "wte", "embed_in", "word_embeddings", "embeddings")
LAYER_LIST_NAMES = ("layers", "h", "blocks", "decoder_layers")
ATTENTION_NAMES = ("self_attn", "attn", "attention", "self_attention", "mixer")
MLP_NAMES = ("mlp", "feed_forward", "block_sparse_moe", "moe", "ffn")
ATTENTION_NORM_NAMES = ("input_layernorm", "ln_1", "attention_norm", "pre_attention_layernorm")
# pre_feedforward_layernorm first: in sandwich layers (Gemma 2, GLM-4 ports) post_attention_layernorm
# is the norm on the attention output, and pre_feedforward_layernorm the one before the MLP
MLP_NORM_NAMES = ("pre_feedforward_layernorm", "post_attention_layernorm", "ln_2", "ffn_norm")
# the norm on the MLP output of post-norm and sandwich layers
POST_MLP_NORM_NAMES = ("post_feedforward_layernorm", "post_mlp_layernorm")
FINAL_NORM_NAMES = ("norm", "ln_f", "final_layernorm", "final_layer_norm", "norm_f")
# inside a multi-latent attention (DeepSeek-V2/V3 names, kept by ports): the normed query latent
# (the query LoRA's norm) and the normed KV latent, compared before the attention output
LATENT_NAMES = (("q_latent", ("q_a_layernorm",)), ("kv_latent", ("kv_a_layernorm",)))


@dataclass(frozen=True)
class Component:
    """A compared component: its report name and its module path."""

    name: str
    module_path: str


def _child(module: nn.Module, names: tuple[str, ...]) -> tuple[str, nn.Module] | None:
    for name in names:
        child = getattr(module, name, None)
        if isinstance(child, nn.Module):
            return name, child
    return None


def find_components(model: nn.Module) -> list[Component]:
    """Components of a causal LM in data-flow order (logits excluded: they are
    the model's output)."""
    found: list[Component] = []
    backbone_entry = _child(model, BACKBONE_NAMES)
    prefix, backbone = ("", model) if backbone_entry is None else (backbone_entry[0] + ".", backbone_entry[1])
    embedding = _child(backbone, EMBEDDING_NAMES)
    if embedding is not None:
        found.append(Component("embedding", prefix + embedding[0]))
    layers = _child(backbone, LAYER_LIST_NAMES)
    if layers is not None and isinstance(layers[1], nn.ModuleList):
        for index, layer in enumerate(layers[1]):
            base = f"{prefix}{layers[0]}.{index}"
            for role, names in (
                ("input_norm", ATTENTION_NORM_NAMES),
                ("attention", ATTENTION_NAMES),
                ("post_attention_norm", MLP_NORM_NAMES),
                ("mlp", MLP_NAMES),
            ):
                child = _child(layer, names)
                if role == "post_attention_norm":
                    child = _mlp_input_norm(layer, child)
                if child is not None:
                    if role == "attention":
                        found.extend(_latents(child[1], index, f"{base}.{child[0]}"))
                    found.append(Component(f"layers.{index}.{role}", f"{base}.{child[0]}"))
            found.append(Component(f"layers.{index}.output", base))
    norm = _child(backbone, FINAL_NORM_NAMES)
    if norm is not None:
        found.append(Component("final_norm", prefix + norm[0]))
    return found


def _mlp_input_norm(layer: nn.Module, found: tuple[str, nn.Module] | None) -> tuple[str, nn.Module] | None:
    """``found`` (the layer's norm named like the one before the MLP), but
    None in a sandwich layer whose MLP applies its input norm itself (a MoE
    port: the norm lives in the experts, next to the router, for the decode
    kernel to fuse it): the layer's ``post_attention_layernorm`` is then the
    norm on the attention output, and the norm before the MLP is not a
    module the layer calls once per step (the shared expert calls it again),
    so it is not compared, as in a pre-norm MoE port."""
    if _child(layer, POST_MLP_NORM_NAMES) is None or found is None or found[0] not in MLP_NORM_NAMES[1:]:
        return found
    mlp = _child(layer, MLP_NAMES)
    if mlp is None:
        return found
    own = [p for p, _ in mlp[1].named_modules() if p and p.rsplit(".", 1)[-1] in MLP_NORM_NAMES]
    return None if own else found


def _latents(attention: nn.Module, index: int, path: str) -> list[Component]:
    """The latent norms of a multi-latent attention module (none for others)."""
    found = []
    for role, names in LATENT_NAMES:
        child = _child(attention, names)
        if child is not None:
            found.append(Component(f"layers.{index}.{role}", f"{path}.{child[0]}"))
    return found


# the forward parameter of a sublayer that adds the block's residual itself
# (BLOOM's attention and MLP, MPT's MLP: ``output + residual``)
RESIDUAL = "residual"


def _residual_given(module: nn.Module, args: Any, kwargs: Any) -> Any:
    """The tensor a sublayer is given as its ``residual`` and adds to its
    output (research reads that add: ``layer_inputs.added_argument``), or
    None. Such a module's output is ``residual + f(x)``: the component is
    ``f(x)``, what a port's attention or MLP returns (it adds the residual
    in the layer)."""
    try:
        bound = inspect.signature(module.forward).bind_partial(*args, **kwargs)
    except (TypeError, ValueError):
        return None
    value = bound.arguments.get(RESIDUAL)
    return value if isinstance(value, torch.Tensor) else None


class ComponentRecorder:
    """Forward hooks that record each component's output per call.

    ``records[name]`` is a list of ``(tag, tensor)``; the tag is whatever
    ``set_tag`` last set (the driver tags each forward call).
    """

    def __init__(self, model: nn.Module, components: list[Component]) -> None:
        self.components = components
        self.records: dict[str, list[tuple[Any, Any]]] = {c.name: [] for c in components}
        self.tag: Any = None
        self._handles = []
        for component in components:
            module = model.get_submodule(component.module_path)
            self._handles.append(module.register_forward_hook(self._hook(component.name), with_kwargs=True))

    def _hook(self, name: str) -> Callable[..., None]:
        def record(module: nn.Module, args: Any, kwargs: Any, output: Any) -> None:
            tensor = output[0] if isinstance(output, (tuple, list)) else output
            residual = _residual_given(module, args, kwargs)
            if residual is not None and residual.shape == tensor.shape:
                tensor = tensor - residual
            self.records[name].append((self.tag, tensor.detach().clone()))

        return record

    def set_tag(self, tag: Any) -> None:
        self.tag = tag

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
