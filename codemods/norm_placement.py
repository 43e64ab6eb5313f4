"""norm-placement: post-norm (OLMo 2) or sandwich norms (Gemma 2/3) in the decoder layer."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import libcst as cst

from autoport_cst.spec.pitfalls import Pitfall
from autoport_cst.transform import Codemod, Example, FileContext, PortContext, locate
from autoport_cst.transform.anatomy.classes import other_uses, self_assignments
from autoport_cst.transform.anatomy.decoder import (
    decoder_layer,
    layer_methods,
    norm_attrs,
    other_model_classes,
    subclasses_role,
)
from autoport_cst.transform.anatomy.mappings import entry_statement
from autoport_cst.transform.cst.snippets import parse_expr, parse_statement
from autoport_cst.transform.cst.vocabulary import (
    classes_with_role,
    deep_statements,
    dotted,
    self_attr,
    simple_assign,
    walk,
)
from autoport_cst.transform.edit.experts_norm import (
    FUSED_FLAG,
    ExpertsNorm,
    experts_mapping_edits,
    experts_norms,
    flag_value,
    moe_placement,
    one_argument,
    reads_attr,
)
from autoport_cst.transform.edit.kernels import innermost_statement, insert_before
from autoport_cst.transform.edit.layer_guards import guard_fused, other_model_file
from autoport_cst.transform.edit.mappings import (
    mapping_entries_of_attr,
    replace_segment,
)
from autoport_cst.transform.edit.tree import add_edit, removal_edits, rewrite, with_comment
from autoport_cst.transform.realizes import Realizes, to


@dataclass(frozen=True)
class NormPlacementParams:
    placement: Literal["post", "sandwich"] = field(
        default="sandwich",
        metadata={
            "doc": "post: norm on each sublayer output before the residual add, no pre-norms (OLMo 2); "
            "sandwich: pre- and post-norms around each sublayer (Gemma 2/3)."
        },
    )
    post_attention_norm: str = field(
        default="post_attention_layernorm",
        metadata={"doc": "Attribute (= checkpoint module name) of the norm on the attention output."},
    )
    pre_mlp_norm: str = field(
        default="pre_feedforward_layernorm",
        metadata={"doc": "Attribute of the norm before the MLP (sandwich only)."},
    )
    post_mlp_norm: str = field(
        default="post_feedforward_layernorm",
        metadata={"doc": "Attribute of the norm on the MLP output."},
    )


class NormPlacement(Codemod):
    """Move the decoder layer's norms to post-norm or sandwich placement.

    The reference is pre-norm: ``h = h + attn(input_norm(h))``, ``h = h +
    mlp(pre_mlp_norm(h))``. Target placements, named as the checkpoints name
    them (the attribute names are the checkpoint module names, so
    ``load_weights`` needs no translation):

    - ``sandwich`` (Gemma 2/3): ``h = h + post_attention_layernorm(attn(
      input_layernorm(h)))``, ``h = h + post_feedforward_layernorm(mlp(
      pre_feedforward_layernorm(h)))``;
    - ``post`` (OLMo 2): ``h = h + post_attention_layernorm(attn(h))``, ``h = h
      + post_feedforward_layernorm(mlp(h))``, no input norm.

    In ``<Prefix>DecoderLayer``: the pre-MLP norm call switches to
    ``pre_mlp_norm`` (sandwich) or is removed with the input-norm call (post);
    ``h = self.<post norm>(h)`` statements follow the attention and MLP calls.
    ``__init__`` gets the new norms (built like the reference's pre-MLP norm)
    and loses the ones no longer used; ``load_weights`` gets entries for the
    new norms (copies of the pre-MLP norm's entries, ``.bias`` included) and
    loses those of removed norms. Note that in the reference
    ``post_attention_layernorm`` is the pre-MLP norm, while in Gemma 2 and
    OLMo 2 it is applied to the attention output: the attribute keeps its
    name and checkpoint key and changes place.

    Every forward of the layer is edited (a decode ``forward`` and a
    ``_forward_prefill``), and every branch of an ``if``/``else`` that calls
    a sublayer. A branch that hands a norm's weight to the sublayer
    (``ln_w=self.input_layernorm.weight``: an FP8 kernel fusing the pre-norm)
    cannot place the norms elsewhere: it is guarded (raises
    ``NotImplementedError`` naming the placement). A model in a module file
    built on the layer (a drafter subclassing it) is guarded with post-norm,
    which removes the input norm it reads.

    A MoE layer (the MoE references) applies no norm before its MLP call:
    its experts class holds the pre-MLP norm, next to the router, so that
    the decode kernel (``NF.moe_block_tkg``, handed the norm's weight) can
    fuse it. The layer gets the post-norms (built like its input norm); with
    ``sandwich`` the experts keep their norm and load it from
    ``pre_mlp_norm``'s checkpoint key; with ``post`` they lose it:
    ``x = self.<norm>(x)`` is removed, ``self.<norm>(x)`` becomes ``x``, and
    a kernel handed the norm's weight is guarded, with the experts'
    ``self.fused_decode`` flag turned off so that decode runs the unfused
    path (an experts class without the flag is refused at the kernel call).
    The dense MLP class ``dense-layers`` builds on the layers without experts
    (``self.mlp = <Prefix>DenseMLP(config) if ... else <Prefix>MLP(config)``)
    holds the same norm and is changed like the experts (its key
    ``<layer>.mlp.<norm>``); another MLP class holding a norm is refused.

    Preconditions: one ``<Prefix>DecoderLayer`` (in a model file of the
    package) whose forwards each run the attention and the MLP in one
    top-level statement: ``h = self.<sublayer>(...)``, or an ``if``/``else``
    with one such statement per branch; each call not handed a norm weight
    preceded by a ``h = self.<norm>(h)`` statement (pre-norm), the same norm
    for a sublayer in every forward; removed norms used nowhere else. A layer
    already in the target placement is left as it is; other placements are
    refused.
    """

    ID = "norm-placement"
    REALIZES = Realizes({"norm.placement": to("post", "sandwich")})
    # where the norms sit around each sublayer call, not what a norm computes
    TOUCHES = ("decoder.sublayer",)
    # the dense MLP class dense-layers adds holds the MoE layers' pre-MLP norm too
    AFTER = ("dense-layers",)
    Params = NormPlacementParams
    PITFALLS = (
        Pitfall(
            30,
            lambda spec, facts: spec.norm.placement == "post",
            "norms are applied to the sublayer outputs before the residual add, not to the sublayer inputs",
        ),
        Pitfall(
            31,
            lambda spec, facts: spec.norm.placement == "sandwich",
            "sandwich norms: a norm before and after every sublayer (four per layer)",
        ),
    )
    FILES = ("model", "module")
    EXAMPLES = (
        Example(
            title="Gemma 2 sandwich norms",
            params={"placement": "sandwich"},
            before="""
                class LlamaDecoderLayer(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.self_attn = LlamaAttention(config, layer_idx)
                        self.mlp = LlamaMLP(config)
                        self.input_layernorm = LlamaRMSNorm(config.hidden_size, config.rms_norm_eps)
                        self.post_attention_layernorm = LlamaRMSNorm(config.hidden_size, config.rms_norm_eps)

                    def forward(self, hidden_states, positions):
                        residual = hidden_states
                        hidden_states = self.input_layernorm(hidden_states)
                        hidden_states = self.self_attn(hidden_states, positions)
                        hidden_states = residual + hidden_states

                        residual = hidden_states
                        hidden_states = self.post_attention_layernorm(hidden_states)
                        hidden_states = self.mlp(hidden_states)
                        return residual + hidden_states


                class LlamaForCausalLM(nn.Module):
                    def load_weights(self, path):
                        mappings = {}
                        for layer_id in range(n):
                            prefix = f"model.layers.{layer_id}"
                            mappings[f"{prefix}.input_layernorm.weight"] = f"{prefix}.input_layernorm.weight"
                            mappings[f"{prefix}.post_attention_layernorm.weight"] = f"{prefix}.post_attention_layernorm.weight"
            """,
            after="""
                class LlamaDecoderLayer(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.self_attn = LlamaAttention(config, layer_idx)
                        self.mlp = LlamaMLP(config)
                        self.input_layernorm = LlamaRMSNorm(config.hidden_size, config.rms_norm_eps)
                        self.post_attention_layernorm = LlamaRMSNorm(config.hidden_size, config.rms_norm_eps)
                        self.pre_feedforward_layernorm = LlamaRMSNorm(config.hidden_size, config.rms_norm_eps)
                        self.post_feedforward_layernorm = LlamaRMSNorm(config.hidden_size, config.rms_norm_eps)

                    def forward(self, hidden_states, positions):
                        residual = hidden_states
                        hidden_states = self.input_layernorm(hidden_states)
                        hidden_states = self.self_attn(hidden_states, positions)
                        hidden_states = self.post_attention_layernorm(hidden_states)
                        hidden_states = residual + hidden_states

                        residual = hidden_states
                        hidden_states = self.pre_feedforward_layernorm(hidden_states)
                        hidden_states = self.mlp(hidden_states)
                        hidden_states = self.post_feedforward_layernorm(hidden_states)
                        return residual + hidden_states


                class LlamaForCausalLM(nn.Module):
                    def load_weights(self, path):
                        mappings = {}
                        for layer_id in range(n):
                            prefix = f"model.layers.{layer_id}"
                            mappings[f"{prefix}.input_layernorm.weight"] = f"{prefix}.input_layernorm.weight"
                            mappings[f"{prefix}.post_attention_layernorm.weight"] = f"{prefix}.post_attention_layernorm.weight"
                            mappings[f"{prefix}.pre_feedforward_layernorm.weight"] = f"{prefix}.pre_feedforward_layernorm.weight"
                            mappings[f"{prefix}.post_feedforward_layernorm.weight"] = f"{prefix}.post_feedforward_layernorm.weight"
            """,
        ),
        Example(
            title="OLMo 2 post-norm",
            params={"placement": "post"},
            before="""
                class LlamaDecoderLayer(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.self_attn = LlamaAttention(config, layer_idx)
                        self.mlp = LlamaMLP(config)
                        self.input_layernorm = LlamaRMSNorm(config.hidden_size, config.rms_norm_eps)
                        self.post_attention_layernorm = LlamaRMSNorm(config.hidden_size, config.rms_norm_eps)

                    def forward(self, hidden_states, positions):
                        residual = hidden_states
                        hidden_states = self.input_layernorm(hidden_states)
                        hidden_states = self.self_attn(hidden_states, positions)
                        hidden_states = residual + hidden_states

                        residual = hidden_states
                        hidden_states = self.post_attention_layernorm(hidden_states)
                        hidden_states = self.mlp(hidden_states)
                        return residual + hidden_states
            """,
            after="""
                class LlamaDecoderLayer(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.self_attn = LlamaAttention(config, layer_idx)
                        self.mlp = LlamaMLP(config)
                        self.post_attention_layernorm = LlamaRMSNorm(config.hidden_size, config.rms_norm_eps)
                        self.post_feedforward_layernorm = LlamaRMSNorm(config.hidden_size, config.rms_norm_eps)

                    def forward(self, hidden_states, positions):
                        residual = hidden_states
                        hidden_states = self.self_attn(hidden_states, positions)
                        hidden_states = self.post_attention_layernorm(hidden_states)
                        hidden_states = residual + hidden_states

                        residual = hidden_states
                        hidden_states = self.mlp(hidden_states)
                        hidden_states = self.post_feedforward_layernorm(hidden_states)
                        return residual + hidden_states
            """,
        ),
        Example(
            title="a layer without pre-norm statements",
            params={"placement": "sandwich"},
            before="""
                class LlamaDecoderLayer(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.self_attn = LlamaAttention(config, layer_idx)
                        self.mlp = LlamaMLP(config)
                        self.input_layernorm = LlamaRMSNorm(config.hidden_size, config.rms_norm_eps)

                    def forward(self, hidden_states, positions):
                        hidden_states = self.self_attn(self.input_layernorm(hidden_states), positions)
                        hidden_states = self.mlp(hidden_states)
                        return hidden_states
            """,
            raises="not a pre-norm layer",
        ),
        Example(
            title="a decode forward with an FP8 branch that fuses the norm, and a prefill forward",
            params={"placement": "post"},
            before="""
                class LlamaDecoderLayer(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.self_attn = attn_cls(config, layer_idx)
                        self.mlp = mlp_cls(config)
                        self.input_layernorm = LlamaRMSNorm(config.hidden_size, config.rms_norm_eps)
                        self.post_attention_layernorm = LlamaRMSNorm(config.hidden_size, config.rms_norm_eps)

                    def forward(self, hidden_states, attn_metadata):
                        if not self._is_decode(attn_metadata):
                            return self._forward_prefill(hidden_states, attn_metadata)
                        hidden_states = _dp_transition(hidden_states, self.mlp_dp_group, self.attn_dp_group)
                        residual = hidden_states
                        if self.fp8:
                            hidden_states = self.self_attn(hidden_states, attn_metadata, ln_w=self.input_layernorm.weight)
                        else:
                            hidden_states = self.input_layernorm(hidden_states)
                            hidden_states = self.self_attn(hidden_states, attn_metadata)
                        hidden_states = residual + hidden_states
                        hidden_states = _dp_transition(hidden_states, self.attn_dp_group, self.mlp_dp_group)
                        residual = hidden_states
                        hidden_states = self.post_attention_layernorm(hidden_states)
                        hidden_states = self.mlp(hidden_states, is_prefill=False)
                        return residual + hidden_states

                    def _forward_prefill(self, hidden_states, attn_metadata):
                        residual = hidden_states
                        hidden_states = self.input_layernorm(hidden_states)
                        hidden_states = self.self_attn(hidden_states, attn_metadata)
                        hidden_states = residual + hidden_states
                        residual = hidden_states
                        hidden_states = self.post_attention_layernorm(hidden_states)
                        hidden_states = self.mlp(hidden_states, is_prefill=True)
                        return residual + hidden_states
            """,
            after="""
                class LlamaDecoderLayer(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.self_attn = attn_cls(config, layer_idx)
                        self.mlp = mlp_cls(config)
                        self.post_attention_layernorm = LlamaRMSNorm(config.hidden_size, config.rms_norm_eps)
                        self.post_feedforward_layernorm = LlamaRMSNorm(config.hidden_size, config.rms_norm_eps)

                    def forward(self, hidden_states, attn_metadata):
                        if not self._is_decode(attn_metadata):
                            return self._forward_prefill(hidden_states, attn_metadata)
                        hidden_states = _dp_transition(hidden_states, self.mlp_dp_group, self.attn_dp_group)
                        residual = hidden_states
                        if self.fp8:
                            raise NotImplementedError("post norm placement: the FP8 kernels fuse a norm before the sublayer")
                        else:
                            hidden_states = self.self_attn(hidden_states, attn_metadata)
                            hidden_states = self.post_attention_layernorm(hidden_states)
                        hidden_states = residual + hidden_states
                        hidden_states = _dp_transition(hidden_states, self.attn_dp_group, self.mlp_dp_group)
                        residual = hidden_states
                        hidden_states = self.mlp(hidden_states, is_prefill=False)
                        hidden_states = self.post_feedforward_layernorm(hidden_states)
                        return residual + hidden_states

                    def _forward_prefill(self, hidden_states, attn_metadata):
                        residual = hidden_states
                        hidden_states = self.self_attn(hidden_states, attn_metadata)
                        hidden_states = self.post_attention_layernorm(hidden_states)
                        hidden_states = residual + hidden_states
                        residual = hidden_states
                        hidden_states = self.mlp(hidden_states, is_prefill=True)
                        hidden_states = self.post_feedforward_layernorm(hidden_states)
                        return residual + hidden_states
            """,
        ),
        Example(
            title="OLMo 2 post-norm on a MoE layer whose pre-MLP norm lives in the experts",
            params={"placement": "post"},
            before="""
                class Qwen3MoeExperts(nn.Module):
                    def __init__(self, config):
                        self.fused_decode = True
                        self.post_attention_layernorm = Qwen3MoeRMSNorm(config.hidden_size, config.rms_norm_eps)

                    def _run_moe_block_tkg(self, hidden_states):
                        output = NF.moe_block_tkg(inp=hidden_states, gamma=self.post_attention_layernorm.weight)
                        return output

                    def forward_prefill(self, hidden_states):
                        hidden_states = self.post_attention_layernorm(hidden_states)
                        return self._experts(hidden_states)

                    def forward_decode(self, hidden_states):
                        if self.fused_decode:
                            return self._run_moe_block_tkg(hidden_states)
                        normalized = self.post_attention_layernorm(hidden_states)
                        return self._experts(normalized)


                class Qwen3MoeMLP(nn.Module):
                    def __init__(self, config):
                        self.experts = Qwen3MoeExperts(config)


                class Qwen3MoeDecoderLayer(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.input_layernorm = Qwen3MoeRMSNorm(config.hidden_size, config.rms_norm_eps)
                        self.self_attn = Qwen3MoeAttention(config, layer_idx)
                        self.mlp = Qwen3MoeMLP(config)

                    def forward(self, hidden_states, positions):
                        residual = hidden_states
                        hidden_states = self.input_layernorm(hidden_states)
                        hidden_states = self.self_attn(hidden_states, positions)
                        hidden_states = residual + hidden_states
                        residual = hidden_states
                        hidden_states = self.mlp(hidden_states, positions)
                        return residual + hidden_states


                class Qwen3MoeForCausalLM(nn.Module):
                    def load_weights(self, path):
                        mappings = {}
                        for layer_id in range(n):
                            prefix = f"model.layers.{layer_id}"
                            mappings[f"{prefix}.input_layernorm.weight"] = f"{prefix}.input_layernorm.weight"
                            mappings[f"{prefix}.mlp.experts.post_attention_layernorm.weight"] = f"{prefix}.post_attention_layernorm.weight"
            """,
            after="""
                class Qwen3MoeExperts(nn.Module):
                    def __init__(self, config):
                        self.fused_decode = False

                    def _run_moe_block_tkg(self, hidden_states):
                        # <-- MODEL-SPECIFIC: no norm before the MoE
                        raise NotImplementedError("post norm placement: NF.moe_block_tkg normalizes its input, and this model has no norm before the MoE")
                        output = NF.moe_block_tkg(inp=hidden_states, gamma=self.post_attention_layernorm.weight)
                        return output

                    def forward_prefill(self, hidden_states):
                        return self._experts(hidden_states)

                    def forward_decode(self, hidden_states):
                        if self.fused_decode:
                            return self._run_moe_block_tkg(hidden_states)
                        normalized = hidden_states
                        return self._experts(normalized)


                class Qwen3MoeMLP(nn.Module):
                    def __init__(self, config):
                        self.experts = Qwen3MoeExperts(config)


                class Qwen3MoeDecoderLayer(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.post_attention_layernorm = Qwen3MoeRMSNorm(config.hidden_size, config.rms_norm_eps)
                        self.post_feedforward_layernorm = Qwen3MoeRMSNorm(config.hidden_size, config.rms_norm_eps)
                        self.self_attn = Qwen3MoeAttention(config, layer_idx)
                        self.mlp = Qwen3MoeMLP(config)

                    def forward(self, hidden_states, positions):
                        residual = hidden_states
                        hidden_states = self.self_attn(hidden_states, positions)
                        hidden_states = self.post_attention_layernorm(hidden_states)
                        hidden_states = residual + hidden_states
                        residual = hidden_states
                        hidden_states = self.mlp(hidden_states, positions)
                        hidden_states = self.post_feedforward_layernorm(hidden_states)
                        return residual + hidden_states


                class Qwen3MoeForCausalLM(nn.Module):
                    def load_weights(self, path):
                        mappings = {}
                        for layer_id in range(n):
                            prefix = f"model.layers.{layer_id}"
                            mappings[f"{prefix}.post_attention_layernorm.weight"] = f"{prefix}.post_attention_layernorm.weight"
                            mappings[f"{prefix}.post_feedforward_layernorm.weight"] = f"{prefix}.post_feedforward_layernorm.weight"
            """,
        ),
    )

    @classmethod
    def params_for(cls, diffs, target, port: PortContext) -> NormPlacementParams:
        return NormPlacementParams(placement=target.norm.placement)

    @classmethod
    def check_params(cls, params: NormPlacementParams) -> list[str]:
        names = [params.post_attention_norm, params.post_mlp_norm]
        if params.placement == "sandwich":
            names.append(params.pre_mlp_norm)
        return [] if len(set(names)) == len(names) else ["the norm attribute names must differ"]

    def transform_module(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        p = self.params
        if ctx.role == "module":
            # post-norm removes the input norm, which a layer built on this one reads
            inherits = any(subclasses_role(c, "decoder_layer") for c in other_model_classes(module))
            return other_model_file(
                module,
                ctx,
                self.touches(),
                f"{p.placement} norm placement",
                guard=p.placement == "post" and inherits,
            )
        layer = decoder_layer(module, ctx)
        experts_hold_norm = any(norm_attrs(c) for c in classes_with_role(module, "experts"))
        if layer is None or p.placement in (
            layer.placement,
            moe_placement(layer) if experts_hold_norm else None,
        ):
            return module
        experts = experts_norms(layer, module, ctx)
        if experts:
            return self._with_experts_norm(layer, experts, module, ctx)
        input_norm, pre_mlp = self._pre_norms(layer, module, ctx)
        removed, added = self._norm_changes(layer, input_norm, pre_mlp, module, ctx)
        assignments = self_assignments(layer.init)
        edits = self._init_edits(layer, assignments, pre_mlp, removed, added, module, ctx)
        guards, guarded = guard_fused(
            module,
            ctx,
            layer,
            f"{p.placement} norm placement: the FP8 kernels fuse a norm before the sublayer",
        )
        edits.update(guards)
        calls = layer.unfused()
        self._forward_edits(layer, calls, pre_mlp, edits, module)
        _mapping_edits(module, pre_mlp, added, removed, edits)
        for attr in removed:
            handled = [assignments[attr][0]] if attr in assignments else []
            handled += [c.pre_norm for c in calls if c.pre_norm_attr == attr] + guarded
            use = other_uses(module, attr, handled)
            if use is not None:
                line, column = locate(module, use)
                raise ctx.precondition(
                    f"{self.ID}: the norm {attr} would be removed but is still used at line {line}, column {column}",
                    use,
                    module,
                )
        return rewrite(module, edits)

    def _with_experts_norm(self, layer, experts: list[ExpertsNorm], module, ctx) -> cst.Module:
        """A pre-norm MoE layer whose pre-MLP norm is the experts' own: the
        layer gets the post-norms (cloned from its input norm) and, with
        post-norm, loses the input norm; the experts keep their norm as the
        pre-MLP norm (sandwich: its checkpoint key becomes ``pre_mlp_norm``'s)
        or lose it (post)."""
        p = self.params
        input_norm = self._one_norm(layer, "attention", module, ctx)
        assignments = self_assignments(layer.init)
        added = [p.post_attention_norm, p.post_mlp_norm]
        if input_norm in added:
            raise ctx.precondition(
                f"{self.ID}: a new norm is named like the input norm ({input_norm})", layer.cls, module
            )
        removed = [input_norm] if p.placement == "post" else []
        edits = self._init_edits(layer, assignments, input_norm, removed, added, module, ctx)
        guards, guarded = guard_fused(
            module,
            ctx,
            layer,
            f"{p.placement} norm placement: the FP8 kernels fuse a norm before the sublayer",
        )
        edits.update(guards)
        calls = layer.unfused()
        self._forward_edits(layer, calls, input_norm, edits, module)
        for found in experts:
            if p.placement == "post":
                others = [e.cls for e in experts if e is not found]  # each checks its own uses
                self._drop_experts_norm(found, module, ctx, edits, others)
            new_key = None if p.placement == "post" else p.pre_mlp_norm
            experts_mapping_edits(self.ID, found, new_key, module, ctx, edits)
        _mapping_edits(module, input_norm, added, removed, edits)
        handled = (
            [assignments[input_norm][0]] + [c.pre_norm for c in calls if c.pre_norm is not None] + guarded
        )
        use = other_uses(module, input_norm, handled) if removed else None
        if use is not None:
            line, column = locate(module, use)
            raise ctx.precondition(
                f"{self.ID}: the norm {input_norm} would be removed but is still used at line {line}, column {column}",
                use,
                module,
            )
        return rewrite(module, edits)

    def _drop_experts_norm(self, found: ExpertsNorm, module, ctx, edits: dict, others) -> None:
        """Post-norm: the experts' input norm goes. ``x = self.<norm>(x)`` is
        removed, ``y = self.<norm>(x)`` becomes ``y = x``; a kernel handed
        the norm's weight (the fused decode kernel) is guarded and the
        ``fused_decode`` flag turned off, so that decode runs the unfused
        path; any other use is refused."""
        name, attr = found.cls.name.value, found.attr
        handled: list[cst.CSTNode] = [found.assignment]
        doomed = [found.assignment]
        fused = []
        for method in layer_methods(found.cls):
            for stmt in deep_statements(method):
                pair = simple_assign(stmt)
                if pair is not None and isinstance(pair[1], cst.Call) and self_attr(pair[1].func) == attr:
                    if isinstance(pair[0], cst.Name) and one_argument(pair[1]) == pair[0].value:
                        doomed.append(stmt)
                        handled.append(stmt)
            removed = {id(n) for stmt in doomed for n in walk(stmt)}
            for node in walk(method):
                if isinstance(node, cst.Call) and self_attr(node.func) == attr and id(node) not in removed:
                    self._norm_call_edit(found, node, module, ctx, edits)
                    handled.append(node)
            for node in walk(method):
                if isinstance(node, cst.Call) and self_attr(node.func) != attr and reads_attr(node, attr):
                    fused.append((method, node))
        for key, edit in removal_edits(found.cls, doomed).items():
            add_edit(edits, key, edit)
        for method, call in fused:
            holder = innermost_statement(method, call)
            flag = flag_value(found.cls)
            if flag is None or holder is None:
                raise ctx.precondition(
                    f"{self.ID}: {name}.{method.name.value}: {dotted(call.func) or 'a kernel'} normalizes the MoE "
                    f"input with self.{attr}, which post-norm removes, and {name} has no self.{FUSED_FLAG} flag "
                    "to run an unfused decode instead",
                    call,
                    module,
                )
            edits[id(flag)] = lambda updated: parse_expr("False", module)
            message = (
                f"{self.params.placement} norm placement: {dotted(call.func)} normalizes its input, "
                "and this model has no norm before the MoE"
            )
            guard = parse_statement(f'raise NotImplementedError("{message}")', module)
            insert_before(edits, holder, [with_comment(guard, "<-- MODEL-SPECIFIC: no norm before the MoE")])
            handled.append(holder)
        use = other_uses(module, attr, handled + others)
        if use is not None:
            raise ctx.precondition(
                f"{self.ID}: {name} uses self.{attr} here, neither as x = self.{attr}(x) nor in a kernel call "
                "post-norm can guard",
                use,
                module,
            )

    def _norm_call_edit(self, found, call: cst.Call, module, ctx, edits: dict) -> None:
        """``self.<norm>(x)`` -> ``x``."""
        if one_argument(call) is None:
            raise ctx.precondition(
                f"{self.ID}: {found.cls.name.value} calls self.{found.attr} with other than one positional "
                "argument",
                call,
                module,
            )
        source = call.args[0].value
        edits[id(call)] = lambda updated, source=source: source

    def _pre_norms(self, layer, module, ctx) -> tuple[str, str]:
        """The input norm and the pre-MLP norm of a pre-norm layer (refused otherwise)."""
        if layer.placement != "pre":
            raise ctx.precondition(
                f"{self.ID}: {layer.name} is not a pre-norm layer (h = self.<norm>(h) right before each "
                f"attention and MLP call, no norm right after them); found placement {layer.placement or 'unknown'}",
                layer.forwards[0].func,
                module,
            )
        return self._one_norm(layer, "attention", module, ctx), self._one_norm(layer, "mlp", module, ctx)

    def _norm_changes(self, layer, input_norm: str, pre_mlp: str, module, ctx) -> tuple[list[str], list[str]]:
        """The norm attributes removed and added by the new placement."""
        p = self.params
        if p.placement == "sandwich":
            wanted = [input_norm, p.post_attention_norm, p.pre_mlp_norm, p.post_mlp_norm]
        else:
            wanted = [p.post_attention_norm, p.post_mlp_norm]
        if p.placement == "sandwich" and input_norm in wanted[1:]:
            raise ctx.precondition(
                f"{self.ID}: a new norm is named like the input norm ({input_norm})", layer.cls, module
            )
        existing = [input_norm, pre_mlp]
        return [a for a in existing if a not in wanted], [a for a in wanted if a not in existing]

    def _init_edits(self, layer, assignments, pre_mlp: str, removed, added, module, ctx) -> dict:
        """``__init__``: the pre-MLP norm cloned for each new attribute, the unused ones removed."""
        if pre_mlp not in assignments:
            raise ctx.precondition(
                f"{self.ID}: {layer.name}.__init__ does not assign self.{pre_mlp}", layer.init, module
            )
        template = assignments[pre_mlp][0]
        clones = [_renamed_assignment(template, a) for a in added]
        edits: dict = removal_edits(
            layer.init, [assignments[a][0] for a in removed if a in assignments and a != pre_mlp]
        )
        if clones:
            # a removed template (post-norm of a MoE layer: the input norm) is replaced by the clones
            kept = [] if pre_mlp in removed else [template]
            add_edit(edits, id(template), lambda updated: cst.FlattenSentinel([*kept, *clones]))
        return edits

    def _forward_edits(self, layer, calls, pre_mlp: str, edits: dict, module) -> None:
        """Every unfused sublayer call of every forward: its pre-norm removed
        (post) or renamed (sandwich), a norm of its output added after it."""
        p = self.params
        if p.placement == "post":
            for key, edit in removal_edits(
                layer.cls, [c.pre_norm for c in calls if c.pre_norm is not None]
            ).items():
                add_edit(edits, key, edit)
        for call in calls:
            if (
                p.placement == "sandwich"
                and call.kind == "mlp"
                and call.pre_norm is not None
                and pre_mlp != p.pre_mlp_norm
            ):
                norm_call = call.pre_norm.body[0].value  # type: ignore[union-attr]
                edits[id(norm_call.func)] = lambda updated: updated.with_changes(
                    attr=cst.Name(p.pre_mlp_norm)
                )
            post = p.post_attention_norm if call.kind == "attention" else p.post_mlp_norm
            stmt = parse_statement(f"{call.variable} = self.{post}({call.variable})", module)
            add_edit(edits, id(call.stmt), lambda updated, stmt=stmt: cst.FlattenSentinel([updated, stmt]))

    def _one_norm(self, layer, kind: str, module, ctx) -> str:
        """The norm every unfused call of ``kind`` is preceded by."""
        found = {c.pre_norm_attr for c in layer.unfused(kind)}
        if len(found) != 1:
            raise ctx.precondition(
                f"{self.ID}: the {kind} calls of {layer.name} are preceded by different norms: "
                f"{', '.join(sorted(str(n) for n in found))}",
                layer.cls,
                module,
            )
        return found.pop()


def _mapping_edits(module: cst.Module, pre_mlp: str, added, removed, edits: dict) -> None:
    """``load_weights``: the pre-MLP norm's entries cloned for each new norm,
    the removed norms' entries removed."""
    template_entries = mapping_entries_of_attr(module, pre_mlp)
    new_entries = []
    for attr in added:
        for entry in template_entries:
            key = replace_segment(entry.key_node, pre_mlp, attr)
            value = replace_segment(entry.value, pre_mlp, attr) or entry.value
            if key is not None:
                new_entries.append(entry_statement(entry, key, value))
    if new_entries:
        keep = pre_mlp not in removed
        add_edit(
            edits,
            id(template_entries[-1].statement),
            lambda updated: cst.FlattenSentinel([updated, *new_entries] if keep else new_entries),
        )
    for attr in removed:
        if attr == pre_mlp and new_entries:
            template_entries = template_entries[:-1]  # replaced by the new entries
            for entry in template_entries:
                add_edit(edits, id(entry.statement), lambda updated: cst.RemoveFromParent())
            continue
        for entry in mapping_entries_of_attr(module, attr):
            add_edit(edits, id(entry.statement), lambda updated: cst.RemoveFromParent())


def _renamed_assignment(stmt: cst.SimpleStatementLine, attr: str) -> cst.SimpleStatementLine:
    """``self.<attr> = <same value>`` shaped like ``stmt`` (no leading comments)."""
    small = stmt.body[0]
    target = small.targets[0].target  # type: ignore[union-attr]
    new_small = small.with_changes(
        targets=[small.targets[0].with_changes(target=target.with_changes(attr=cst.Name(attr)))]  # type: ignore[union-attr]
    )
    return stmt.with_changes(body=[new_small], leading_lines=[])
