"""parallel-residual: attention and MLP read the same input and are summed (GPT-J, Phi, GPT-NeoX)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import libcst as cst

from autoport_cst.transform import Codemod, Example, FileContext, PortContext, locate
from autoport_cst.transform.cst_helpers import (
    code_of,
    parse_statements,
    positional_args,
    rewrite,
    simple_assign,
    with_statements,
)
from autoport_cst.transform.layers import (
    assigned_call,
    assigned_name,
    layer_forward,
    mapping_entries_of_attr,
    other_uses,
    removal_edits,
    self_assignments,
)


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

    Preconditions: one ``<Prefix>DecoderLayer`` whose ``forward`` is the
    sequential pre-norm form: ``r = h``, ``h = self.<norm>(h)``, ``h =
    self.<attention>(h, ...)``, ``h = r + h``, ``r = h``, ``h = self.<norm>(h)``,
    ``h = self.<mlp>(h, ...)``, ``return r + h``; the deleted norm used
    nowhere else. A layer already parallel with the requested norms is left
    as it is.
    """

    ID = "parallel-residual"
    REALIZES = ("residual.parallel",)
    Params = ParallelResidualParams
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
    )

    @classmethod
    def realizes(cls, diff) -> bool:
        return diff.path in cls.REALIZES and diff.target in ("shared_norm", "separate_norms")

    @classmethod
    def params_for(cls, diffs, target, port: PortContext) -> ParallelResidualParams:
        return ParallelResidualParams(kind=target.residual.parallel)

    def transform_module(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        shape = layer_forward(module, ctx, self.ID)
        name = shape.layer.name.value
        body = shape.body
        attn_index, mlp_index = body.index(shape.attn), body.index(shape.mlp)
        attn_var, mlp_var = assigned_name(shape.attn), assigned_name(shape.mlp)
        if attn_var != mlp_var and mlp_index == attn_index + 1:
            return self._already(shape, module, ctx)
        start = attn_index - 2
        expected = self._sequential(shape, start)
        if expected is None:
            raise ctx.precondition(
                f"{self.ID}: {name}.forward is not the sequential pre-norm form (r = h; h = norm(h); "
                "h = attn(h, ...); h = r + h; r = h; h = norm(h); h = mlp(h, ...); return r + h)",
                shape.forward,
                module,
            )
        residual, hidden = expected
        input_norm = _called(shape.pre_attn)
        pre_mlp = _called(shape.pre_mlp)
        attn_call = assigned_call(shape.attn)
        mlp_call = assigned_call(shape.mlp)
        if self.params.kind == "shared_norm":
            attn_args = code_of(_with_first_arg(attn_call, hidden))
            mlp_args = code_of(_with_first_arg(mlp_call, hidden))
            code = (
                f"{residual} = {hidden}\n"
                f"{hidden} = self.{input_norm}({hidden})\n"
                f"attn_output = {attn_args}\n"
                f"mlp_output = {mlp_args}\n"
                f"return attn_output + mlp_output + {residual}\n"
            )
        else:
            attn_args = code_of(_with_first_arg(attn_call, "attn_input"))
            mlp_args = code_of(_with_first_arg(mlp_call, "mlp_input"))
            code = (
                f"{residual} = {hidden}\n"
                f"attn_input = self.{input_norm}({hidden})\n"
                f"mlp_input = self.{pre_mlp}({hidden})\n"
                f"attn_output = {attn_args}\n"
                f"mlp_output = {mlp_args}\n"
                f"return attn_output + mlp_output + {residual}\n"
            )
        new = parse_statements(code, module)
        new[0] = new[0].with_changes(leading_lines=body[start].leading_lines)
        forward = with_statements(shape.forward, [*body[:start], *new])
        edits: dict = {id(shape.forward): lambda updated: forward}
        if self.params.kind == "shared_norm":
            edits.update(self._remove_norm(module, ctx, shape, pre_mlp))
        return rewrite(module, edits)

    def _sequential(self, shape, start: int) -> tuple[str, str] | None:
        """(residual name, hidden name) when body[start:] is the sequential pre-norm form."""
        body = shape.body
        tail = body[start:]
        if start < 0 or len(tail) != 8 or shape.post_attn is not None or shape.post_mlp is not None:
            return None
        copy = simple_assign(tail[0])
        if copy is None or not isinstance(copy[0], cst.Name) or not isinstance(copy[1], cst.Name):
            return None
        residual, hidden = copy[0].value, copy[1].value
        ok = (
            tail[1] is shape.pre_attn
            and tail[2] is shape.attn
            and _is_add_of(tail[3], residual, hidden, assign=hidden)
            and _is_copy(tail[4], residual, hidden)
            and tail[5] is shape.pre_mlp
            and tail[6] is shape.mlp
            and _is_add_of(tail[7], residual, hidden, assign=None)
            and assigned_name(shape.attn) == hidden
            and assigned_name(shape.mlp) == hidden
            and _first_arg_is(assigned_call(shape.attn), hidden)
            and _first_arg_is(assigned_call(shape.mlp), hidden)
        )
        return (residual, hidden) if ok else None

    def _already(self, shape, module, ctx):
        attn_first = positional_args(assigned_call(shape.attn))[:1]
        mlp_first = positional_args(assigned_call(shape.mlp))[:1]
        same = bool(attn_first and mlp_first) and code_of(attn_first[0].value) == code_of(mlp_first[0].value)
        if same == (self.params.kind == "shared_norm"):
            return module
        raise ctx.precondition(
            f"{self.ID}: {shape.layer.name.value}.forward already computes attention and MLP in parallel, "
            f"with {'one shared' if same else 'separate'} input(s)",
            shape.forward,
            module,
        )

    def _remove_norm(self, module, ctx, shape, attr: str) -> dict:
        assignments = self_assignments(shape.init)
        doomed = [assignments[attr][0]] if attr in assignments else []
        edits = removal_edits(shape.init, doomed)
        for entry in mapping_entries_of_attr(module, attr):
            edits[id(entry.statement)] = lambda updated: cst.RemoveFromParent()
        use = other_uses(module, attr, [*doomed, shape.forward])
        if use is not None:
            line, column = locate(module, use)
            raise ctx.precondition(
                f"{self.ID}: the norm {attr} is removed with a shared norm but is still used at line {line}, "
                f"column {column}",
                use,
                module,
            )
        return edits


def _called(stmt) -> str:
    return stmt.body[0].value.func.attr.value


def _first_arg_is(call: cst.Call | None, name: str) -> bool:
    args = positional_args(call) if call is not None else []
    return bool(args) and isinstance(args[0].value, cst.Name) and args[0].value.value == name


def _with_first_arg(call: cst.Call, name: str) -> cst.Call:
    first = positional_args(call)[0]
    return call.with_changes(args=[a.with_changes(value=cst.Name(name)) if a is first else a for a in call.args])


def _is_copy(stmt, target: str, source: str) -> bool:
    pair = simple_assign(stmt)
    return (
        pair is not None
        and isinstance(pair[0], cst.Name) and pair[0].value == target
        and isinstance(pair[1], cst.Name) and pair[1].value == source
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
        value = pair[1] if pair is not None and isinstance(pair[0], cst.Name) and pair[0].value == assign else None
    if not (isinstance(value, cst.BinaryOperation) and isinstance(value.operator, cst.Add)):
        return False
    names = {getattr(value.left, "value", None), getattr(value.right, "value", None)}
    return names == {a, b} and all(isinstance(s, cst.Name) for s in (value.left, value.right))
