"""parallel-residual: attention and MLP read the same input and are summed (GPT-J, Phi, GPT-NeoX)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import libcst as cst

from autoport_cst.spec.pitfalls import Pitfall
from autoport_cst.transform import Codemod, Example, FileContext, PortContext, locate
from autoport_cst.transform.anatomy.classes import assigned_call, assigned_name, other_uses, self_assignments
from autoport_cst.transform.anatomy.decoder import (
    DecoderForward,
    DecoderLayer,
    SublayerCall,
    decoder_layer,
    other_model_classes,
    subclasses_role,
)
from autoport_cst.transform.cst.snippets import parse_statement
from autoport_cst.transform.cst.vocabulary import code_of, positional_args, simple_assign
from autoport_cst.transform.edit.experts_norm import experts_mapping_edits, experts_norms
from autoport_cst.transform.edit.layer_guards import guard_fused, other_model_file
from autoport_cst.transform.edit.mappings import mapping_entries_of_attr
from autoport_cst.transform.edit.tree import add_edit, removal_edits, rewrite
from autoport_cst.transform.realizes import Realizes, to


@dataclass(frozen=True)
class ParallelResidualParams:
    kind: Literal["shared_norm", "separate_norms"] = field(
        default="shared_norm",
        metadata={
            "doc": "shared_norm: one norm feeds both sublayers (GPT-J, Phi); separate_norms: the attention "
            "and MLP each have their norm of the same input (GPT-NeoX use_parallel_residual)."
        },
    )


class ParallelResidual(Codemod):
    """Compute attention and MLP from the same layer input and add both to the residual.

    From the reference's sequential pre-norm layer, the decoder layer's
    ``forward`` (``<Prefix>DecoderLayer``) becomes, with ``shared_norm``::

        residual = h
        h = self.input_layernorm(h)
        attn_output = self.self_attn(h, ...)
        mlp_output = self.mlp(h, ...)
        return attn_output + mlp_output + residual

    and with ``separate_norms`` the MLP reads ``self.post_attention_layernorm(h)``
    of the layer input (``attn_input`` / ``mlp_input``). The sum follows
    transformers' order (sublayers first, then the residual). Collectives do
    not change: in prefill both sublayers all-gather the sequence-parallel
    input and reduce-scatter their output back to the same slice, in decode
    both all-reduce, so their outputs add up on every rank.

    With ``shared_norm`` the pre-MLP norm is deleted with its ``load_weights``
    entries (the checkpoint has none). The other arguments of the attention
    and MLP calls are kept; statements before the first residual copy (such
    as ``is_prefill = ...``) stay.

    Every forward of the layer is rewritten (a decode ``forward`` and a
    ``_forward_prefill``). Statements between the two residual blocks that
    move the rows between data-parallel layouts (``h = _dp_transition(h,
    ...)``: gathers and slices, which distribute over a sum) are applied to
    each term carried past them: the attention output, the residual and the
    MLP's input. A sublayer called in an ``if``/``else`` keeps its branches;
    a branch handing a norm's weight to the sublayer (an FP8 kernel fusing
    the norm into the sequential layer) is guarded (raises
    ``NotImplementedError``). A drafter in a module file that subclasses the
    layer is guarded when the shared norm removes the norm it reads.

    A MoE layer (the MoE references) applies no norm before its MLP call:
    its experts class holds the pre-MLP norm (next to the router, for the
    fused decode kernel), as does the dense MLP ``dense-layers`` builds
    instead of them. The MLP then reads the layer input (the residual copy,
    carried through the data-parallel transitions like the other terms) and
    normalizes it itself: with ``shared_norm`` its norm loads the input
    norm's checkpoint weights (Cohere2 MoE); with ``separate_norms`` it keeps
    its own. Every site of that norm (prefill, the unfused decode and the
    fused kernel's ``gamma``) reads the same module, so none is left.

    Preconditions: one ``<Prefix>DecoderLayer`` whose forwards are each the
    sequential pre-norm form: ``r = h``, ``h = self.<norm>(h)``, ``h =
    self.<attention>(h, ...)``, ``h = r + h``, any ``h = f(h, ...)``, ``r =
    h``, ``h = self.<norm>(h)``, ``h = self.<mlp>(h, ...)``, ``return r + h``
    (each sublayer call, with its norm, possibly one per branch of an
    ``if``/``else``); the deleted norm used nowhere else. A layer already
    parallel with the requested norms is left as it is.
    """

    ID = "parallel-residual"
    REALIZES = Realizes({"residual.parallel": to("shared_norm", "separate_norms")})
    Params = ParallelResidualParams
    PITFALLS = (
        Pitfall(
            290,
            lambda spec, facts: spec.residual.parallel != "none",
            "parallel residual ({spec.residual.parallel}): attention and MLP outputs are summed, both must "
            "be computed in the same DP state",
        ),
    )
    FILES = ("model", "module")
    EXAMPLES = (
        Example(
            title="Phi: one shared norm",
            params={"kind": "shared_norm"},
            before="""
                class LlamaDecoderLayer(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.self_attn = LlamaAttention(config, layer_idx)
                        self.mlp = LlamaMLP(config)
                        self.input_layernorm = LlamaLayerNorm(config.hidden_size, config.layer_norm_eps)
                        self.post_attention_layernorm = LlamaLayerNorm(config.hidden_size, config.layer_norm_eps)

                    def forward(self, hidden_states, positions, attn_metadata=None):
                        is_prefill = _is_prefill(attn_metadata)

                        residual = hidden_states
                        hidden_states = self.input_layernorm(hidden_states)
                        hidden_states = self.self_attn(hidden_states, positions, attn_metadata)
                        hidden_states = residual + hidden_states

                        residual = hidden_states
                        hidden_states = self.post_attention_layernorm(hidden_states)
                        hidden_states = self.mlp(hidden_states, is_prefill=is_prefill)
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
                        self.input_layernorm = LlamaLayerNorm(config.hidden_size, config.layer_norm_eps)

                    def forward(self, hidden_states, positions, attn_metadata=None):
                        is_prefill = _is_prefill(attn_metadata)

                        residual = hidden_states
                        hidden_states = self.input_layernorm(hidden_states)
                        attn_output = self.self_attn(hidden_states, positions, attn_metadata)
                        mlp_output = self.mlp(hidden_states, is_prefill=is_prefill)
                        return attn_output + mlp_output + residual


                class LlamaForCausalLM(nn.Module):
                    def load_weights(self, path):
                        mappings = {}
                        for layer_id in range(n):
                            prefix = f"model.layers.{layer_id}"
                            mappings[f"{prefix}.input_layernorm.weight"] = f"{prefix}.input_layernorm.weight"
            """,
        ),
        Example(
            title="GPT-NeoX: a norm per sublayer",
            params={"kind": "separate_norms"},
            before="""
                class LlamaDecoderLayer(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.self_attn = LlamaAttention(config, layer_idx)
                        self.mlp = LlamaMLP(config)
                        self.input_layernorm = LlamaLayerNorm(config.hidden_size, config.layer_norm_eps)
                        self.post_attention_layernorm = LlamaLayerNorm(config.hidden_size, config.layer_norm_eps)

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
                        self.input_layernorm = LlamaLayerNorm(config.hidden_size, config.layer_norm_eps)
                        self.post_attention_layernorm = LlamaLayerNorm(config.hidden_size, config.layer_norm_eps)

                    def forward(self, hidden_states, positions):
                        residual = hidden_states
                        attn_input = self.input_layernorm(hidden_states)
                        mlp_input = self.post_attention_layernorm(hidden_states)
                        attn_output = self.self_attn(attn_input, positions)
                        mlp_output = self.mlp(mlp_input)
                        return attn_output + mlp_output + residual
            """,
        ),
        Example(
            title="Cohere2 MoE: one shared norm, the experts norming the MLP input",
            params={"kind": "shared_norm"},
            before="""
                class Qwen3MoeExperts(nn.Module):
                    def __init__(self, config):
                        self.post_attention_layernorm = Qwen3MoeRMSNorm(config.hidden_size, config.rms_norm_eps)

                    def forward(self, hidden_states):
                        return self._experts(self.post_attention_layernorm(hidden_states))


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
                        self.post_attention_layernorm = Qwen3MoeRMSNorm(config.hidden_size, config.rms_norm_eps)

                    def forward(self, hidden_states):
                        return self._experts(self.post_attention_layernorm(hidden_states))


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
                        attn_output = self.self_attn(hidden_states, positions)
                        mlp_output = self.mlp(residual, positions)
                        return attn_output + mlp_output + residual


                class Qwen3MoeForCausalLM(nn.Module):
                    def load_weights(self, path):
                        mappings = {}
                        for layer_id in range(n):
                            prefix = f"model.layers.{layer_id}"
                            mappings[f"{prefix}.input_layernorm.weight"] = f"{prefix}.input_layernorm.weight"
                            mappings[f"{prefix}.mlp.experts.post_attention_layernorm.weight"] = f"{prefix}.input_layernorm.weight"
            """,
        ),
        Example(
            title="post-norm layers are not rewritten",
            params={"kind": "shared_norm"},
            before="""
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
            raises="not the sequential pre-norm form",
        ),
        Example(
            title="a decode forward moving rows between data-parallel layouts, and a prefill forward",
            params={"kind": "separate_norms"},
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
                        self.input_layernorm = LlamaRMSNorm(config.hidden_size, config.rms_norm_eps)
                        self.post_attention_layernorm = LlamaRMSNorm(config.hidden_size, config.rms_norm_eps)

                    def forward(self, hidden_states, attn_metadata):
                        if not self._is_decode(attn_metadata):
                            return self._forward_prefill(hidden_states, attn_metadata)
                        hidden_states = _dp_transition(hidden_states, self.mlp_dp_group, self.attn_dp_group)
                        residual = hidden_states
                        mlp_input = self.post_attention_layernorm(hidden_states)
                        if self.fp8:
                            raise NotImplementedError("parallel residual: the FP8 kernels fuse each sublayer's norm into the sequential layer")
                        else:
                            attn_input = self.input_layernorm(hidden_states)
                            attn_output = self.self_attn(attn_input, attn_metadata)
                        attn_output = _dp_transition(attn_output, self.attn_dp_group, self.mlp_dp_group)
                        residual = _dp_transition(residual, self.attn_dp_group, self.mlp_dp_group)
                        mlp_input = _dp_transition(mlp_input, self.attn_dp_group, self.mlp_dp_group)
                        mlp_output = self.mlp(mlp_input, is_prefill=False)
                        return attn_output + mlp_output + residual

                    def _forward_prefill(self, hidden_states, attn_metadata):
                        residual = hidden_states
                        attn_input = self.input_layernorm(hidden_states)
                        mlp_input = self.post_attention_layernorm(hidden_states)
                        attn_output = self.self_attn(attn_input, attn_metadata)
                        mlp_output = self.mlp(mlp_input, is_prefill=True)
                        return attn_output + mlp_output + residual
            """,
        ),
    )

    @classmethod
    def params_for(cls, diffs, target, port: PortContext) -> ParallelResidualParams:
        return ParallelResidualParams(kind=target.residual.parallel)

    def transform_module(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        kind = self.params.kind
        if ctx.role == "module":
            # a shared norm removes the pre-MLP norm, which a layer built on this one reads
            inherits = any(subclasses_role(c, "decoder_layer") for c in other_model_classes(module))
            return other_model_file(
                module,
                ctx,
                self.touches(),
                f"parallel residual ({kind})",
                guard=kind == "shared_norm" and inherits,
            )
        layer = decoder_layer(module, ctx)
        if layer is None:
            return module
        # a MoE layer: the experts (and a dense MLP built instead of them) apply the pre-MLP norm
        experts = experts_norms(layer, module, ctx)
        if self._already(layer, module, ctx, bool(experts)):
            return module
        forms = [
            _sequential(layer, forward, module, ctx, self.ID, bool(experts)) for forward in layer.forwards
        ]
        pre_mlp = {form.pre_mlp for form in forms}
        if len(pre_mlp) != 1 or len({form.input_norm for form in forms}) != 1:
            raise ctx.precondition(
                f"{self.ID}: the forwards of {layer.name} use different norms before the same sublayer",
                layer.cls,
                module,
            )
        edits, guarded = guard_fused(
            module,
            ctx,
            layer,
            "parallel residual: the FP8 kernels fuse each sublayer's norm into the sequential layer",
        )
        for form in forms:
            for key, edit in form.edits(kind, module).items():
                add_edit(edits, key, edit)
        if kind == "shared_norm" and experts:
            # the MLP reads the layer input, which its own norm normalizes with the input norm's weights
            for found in experts:
                experts_mapping_edits(self.ID, found, forms[0].input_norm, module, ctx, edits)
        elif kind == "shared_norm":
            for key, edit in self._remove_norm(module, ctx, layer, pre_mlp.pop(), guarded).items():
                add_edit(edits, key, edit)
        return rewrite(module, edits)

    def _already(self, layer, module, ctx, moe: bool) -> bool:
        """Whether every forward already computes both sublayers from the
        layer input (the attention's result is not its input's name); a
        parallel layer with the other kind of norms is refused. The MLP of a
        MoE layer reads the layer input whatever the kind (its experts norm it)."""
        shapes = set()
        for forward in layer.forwards:
            attn = [c for c in forward.slots["attention"].calls if c.fused is None]
            mlp = [c for c in forward.slots["mlp"].calls if c.fused is None]
            if not attn or not mlp or any(c.variable in _input_names(c.call) for c in attn):
                return False
            shapes.add(_hidden_input(attn[0].call) == _hidden_input(mlp[0].call))
        if shapes == {self.params.kind == "shared_norm" and not moe}:
            return True
        raise ctx.precondition(
            f"{self.ID}: {layer.name} already computes attention and MLP in parallel, "
            f"with {'one shared' if True in shapes else 'separate'} input(s)",
            layer.cls,
            module,
        )

    def _remove_norm(self, module, ctx, layer, attr: str, guarded) -> dict:
        assignments = self_assignments(layer.init)
        doomed = [assignments[attr][0]] if attr in assignments else []
        edits = removal_edits(layer.init, doomed)
        for entry in mapping_entries_of_attr(module, attr):
            edits[id(entry.statement)] = lambda updated: cst.RemoveFromParent()
        use = other_uses(module, attr, [*doomed, *(f.func for f in layer.forwards), *guarded])
        if use is not None:
            line, column = locate(module, use)
            raise ctx.precondition(
                f"{self.ID}: the norm {attr} is removed with a shared norm but is still used at line {line}, "
                f"column {column}",
                use,
                module,
            )
        return edits


@dataclass
class _Sequential:
    """One forward in the sequential pre-norm form: ``r = h``, the attention
    slot, ``h = r + h``, statements moving ``h`` between layouts (``h =
    f(h, ...)``), ``r = h``, the MLP slot, ``return r + h``."""

    forward: DecoderForward
    moe: bool  # the MLP calls are not normed in the layer: their experts norm their input
    residual: str
    hidden: str
    attn: list[SublayerCall]  # the unfused calls (fused ones are guarded)
    mlp: list[SublayerCall]
    copy: cst.BaseStatement  # r = h before the attention
    anchor: cst.BaseStatement  # where the MLP input is computed with separate norms
    removed: list[cst.BaseStatement]  # the first residual add and the second copy
    middle: list[cst.SimpleStatementLine]
    tail: list[cst.BaseStatement]

    @property
    def input_norm(self) -> str:
        return self.attn[0].pre_norm_attr  # type: ignore[return-value]

    @property
    def pre_mlp(self) -> str | None:
        return self.mlp[0].pre_norm_attr

    def edits(self, kind: str, module: cst.Module) -> dict:
        r, h = self.residual, self.hidden
        # a MoE layer's MLP reads the layer input (r), which its experts normalize
        separate = kind == "separate_norms" and not self.moe
        doomed = list(self.removed) + [c.pre_norm for c in self.mlp if c.pre_norm is not None]
        edits = removal_edits(self.forward.func, doomed)  # type: ignore[arg-type]
        for call in self.attn:
            source = "attn_input" if separate else h
            add_edit(edits, id(call.stmt), _assigning(call, "attn_output", h, source, module))
            if separate:
                add_edit(edits, id(call.pre_norm), _renamed_target("attn_input"))
        mlp_input = r if self.moe else "mlp_input" if separate else h
        for call in self.mlp:
            add_edit(edits, id(call.stmt), _assigning(call, "mlp_output", h, mlp_input, module))
        if separate:
            hoisted = parse_statement(f"mlp_input = self.{self.pre_mlp}({h})", module)
            add_edit(edits, id(self.anchor), lambda updated: cst.FlattenSentinel([updated, hoisted]))
        carried = list(dict.fromkeys(["attn_output", r, mlp_input]))
        for stmt in self.middle:
            copies = [_rebound(stmt, h, name, module) for name in carried]
            add_edit(
                edits,
                id(stmt),
                lambda updated, copies=copies: cst.FlattenSentinel(
                    [copies[0].with_changes(leading_lines=updated.leading_lines), *copies[1:]]
                ),
            )
        total = parse_statement(f"return attn_output + mlp_output + {r}", module)
        first, rest = self.tail[0], self.tail[1:]
        add_edit(edits, id(first), lambda updated: total.with_changes(leading_lines=updated.leading_lines))
        for stmt in rest:
            edits[id(stmt)] = lambda updated: cst.RemoveFromParent()
        return edits


def _sequential(
    layer: DecoderLayer, forward: DecoderForward, module, ctx, codemod_id: str, moe: bool
) -> _Sequential:
    where = f"{layer.name}.{forward.func.name.value}"

    def refuse(what: str, node: cst.CSTNode):
        return ctx.precondition(
            f"{codemod_id}: {where} is not the sequential pre-norm form (r = h; h = norm(h); h = attn(h, ...); "
            f"h = r + h; [h = f(h, ...)]; r = h; h = norm(h); h = mlp(h, ...); return r + h): {what}",
            node,
            module,
        )

    body = forward.body
    slots = [forward.slots["attention"], forward.slots["mlp"]]
    live = [[c for c in slot.calls if c.fused is None] for slot in slots]
    starts = []
    for slot, calls in zip(slots, live, strict=False):
        if not calls:
            raise refuse(f"every branch of the self.<{slot.kind}> call fuses its norm", slot.stmt)
        for call in calls:
            # (a MoE layer's experts norm the MLP input themselves)
            if call.post_norm is not None or (call.pre_norm is None and not (moe and slot.kind == "mlp")):
                raise refuse(f"self.<{slot.kind}> is not preceded by h = self.<norm>(h) alone", call.stmt)
        top = calls[0].pre_norm if slot.stmt is calls[0].stmt else None
        starts.append((body.index(top) if top is not None else body.index(slot.stmt), top))
    (start_a, top_a), (start_b, _) = starts
    ia, ib = body.index(slots[0].stmt), body.index(slots[1].stmt)
    copy = body[start_a - 1] if start_a > 0 else None
    pair = simple_assign(copy) if copy is not None else None
    if pair is None or not isinstance(pair[0], cst.Name) or not isinstance(pair[1], cst.Name):
        raise refuse("no r = h right before the attention", slots[0].stmt)
    r, h = pair[0].value, pair[1].value
    if not all(c.variable == h and _hidden_input(c.call) == h for calls in live for c in calls):
        raise refuse(f"the sublayer calls do not read and assign {h}", slots[0].stmt)
    if ia + 1 >= len(body) or not _is_add_of(body[ia + 1], r, h, assign=h):
        raise refuse(f"no {h} = {r} + {h} right after the attention", slots[0].stmt)
    if not _is_copy(body[start_b - 1], r, h):
        raise refuse(f"no {r} = {h} right before the MLP", slots[1].stmt)
    middle = body[ia + 2 : start_b - 1]
    for stmt in middle:
        if not _is_transition(stmt, h):
            raise refuse(f"between the sublayers, a statement other than {h} = f({h}, ...)", stmt)
    tail = body[ib + 1 :]
    if not (
        (len(tail) == 1 and _is_add_of(tail[0], r, h, assign=None))
        or (len(tail) == 2 and _is_add_of(tail[0], r, h, assign=h) and _returns(tail[1], h))
    ):
        raise refuse(f"the MLP is not followed by return {r} + {h}", slots[1].stmt)
    return _Sequential(
        forward,
        moe,
        r,
        h,
        live[0],
        live[1],
        copy,
        top_a if top_a is not None else copy,
        [body[ia + 1], body[start_b - 1]],
        middle,
        tail,
    )


def _input_names(call: cst.Call) -> set[str]:
    """The names passed whole as arguments (the hidden states a sublayer reads)."""
    return {a.value.value for a in call.args if isinstance(a.value, cst.Name)}


def _hidden_input(call: cst.Call) -> str | None:
    """The hidden states a sublayer reads: its first positional argument, or
    its ``hidden_states=`` keyword."""
    args = positional_args(call)
    arg = (
        args[0]
        if args
        else next((a for a in call.args if a.keyword and a.keyword.value == "hidden_states"), None)
    )
    return arg.value.value if arg is not None and isinstance(arg.value, cst.Name) else None


def _assigning(call: SublayerCall, target: str, hidden: str, source: str, module: cst.Module):
    """An edit making ``h = self.<sublayer>(..., h, ...)`` assign ``target``
    and read ``source`` where it read ``h``."""

    def edit(updated: cst.SimpleStatementLine) -> cst.SimpleStatementLine:
        small = updated.body[0]
        value = small.value
        args = [
            a.with_changes(value=cst.Name(source))
            if isinstance(a.value, cst.Name) and a.value.value == hidden
            else a
            for a in value.args
        ]
        return updated.with_changes(
            body=[
                small.with_changes(
                    targets=[small.targets[0].with_changes(target=cst.Name(target))],
                    value=value.with_changes(args=args),
                )
            ]
        )

    return edit


def _renamed_target(name: str):
    def edit(updated: cst.SimpleStatementLine) -> cst.SimpleStatementLine:
        small = updated.body[0]
        return updated.with_changes(
            body=[small.with_changes(targets=[small.targets[0].with_changes(target=cst.Name(name))])]
        )

    return edit


def _is_transition(stmt: cst.BaseStatement, hidden: str) -> bool:
    """``h = f(h, ...)`` with ``f`` a function (not a module of the layer):
    a move of the rows between layouts (a gather or a slice), which applied
    to a sum can be applied to each term."""
    call = assigned_call(stmt)
    return (
        call is not None
        and assigned_name(stmt) == hidden
        and isinstance(call.func, cst.Name)
        and bool(positional_args(call))
        and isinstance(positional_args(call)[0].value, cst.Name)
        and positional_args(call)[0].value.value == hidden
    )


def _rebound(stmt: cst.SimpleStatementLine, hidden: str, name: str, module: cst.Module) -> cst.BaseStatement:
    """``name = f(name, ...)`` for ``hidden = f(hidden, ...)``."""
    call = assigned_call(stmt)
    first = positional_args(call)[0]
    args = [a.with_changes(value=cst.Name(name)) if a is first else a for a in call.args]
    code = code_of(call.with_changes(args=args))
    return parse_statement(f"{name} = {code}", module)


def _returns(stmt: cst.BaseStatement, name: str) -> bool:
    return (
        isinstance(stmt, cst.SimpleStatementLine)
        and isinstance(stmt.body[0], cst.Return)
        and isinstance(stmt.body[0].value, cst.Name)
        and stmt.body[0].value.value == name
    )


def _is_copy(stmt, target: str, source: str) -> bool:
    pair = simple_assign(stmt)
    return (
        pair is not None
        and isinstance(pair[0], cst.Name)
        and pair[0].value == target
        and isinstance(pair[1], cst.Name)
        and pair[1].value == source
    )


def _is_add_of(stmt, a: str, b: str, assign: str | None) -> bool:
    """``assign = a + b`` (either order), or ``return a + b`` when ``assign`` is None."""
    if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
        return False
    small = stmt.body[0]
    if assign is None:
        value = small.value if isinstance(small, cst.Return) else None
    else:
        pair = simple_assign(stmt)
        value = (
            pair[1]
            if pair is not None and isinstance(pair[0], cst.Name) and pair[0].value == assign
            else None
        )
    if not (isinstance(value, cst.BinaryOperation) and isinstance(value.operator, cst.Add)):
        return False
    names = {getattr(value.left, "value", None), getattr(value.right, "value", None)}
    return names == {a, b} and all(isinstance(s, cst.Name) for s in (value.left, value.right))
