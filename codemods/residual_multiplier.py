"""residual-multiplier: sublayer outputs scaled before the residual add (Granite)."""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from autoport_cst.transform import Codemod, Example, FileContext, PortContext
from autoport_cst.transform.anatomy.classes import class_here
from autoport_cst.transform.anatomy.decoder import layer_forwards
from autoport_cst.transform.cst.snippets import parse_expr
from autoport_cst.transform.cst.vocabulary import deep_statements, self_attr, simple_assign, walk
from autoport_cst.transform.edit.config_fields import config_scalar_edit, init_reads_config
from autoport_cst.transform.edit.layer_guards import other_model_file
from autoport_cst.transform.edit.tree import rewrite
from autoport_cst.transform.realizes import Realizes, not_to


@dataclass(frozen=True)
class ResidualMultiplierParams:
    config_key: str = field(
        default="residual_multiplier", metadata={"doc": "Config field holding the multiplier."}
    )
    default: float = field(default=1.0, metadata={"doc": "Its value when the config has none."})


class ResidualMultiplier(Codemod):
    """Scale each sublayer's output by a constant before it is added to the residual stream.

    Granite computes ``h = residual + sublayer(...) * residual_multiplier`` for
    attention and MLP. In the decoder layer (``<Prefix>DecoderLayer``):
    ``__init__`` gets ``self.<key> = config.<key>``; in every forward (every
    method calling the attention or the MLP: a decode ``forward`` and a
    ``_forward_prefill``, FP8 branches included) every addition with a residual variable (a name assigned a plain copy of
    another, ``residual = hidden_states``) has its other operand multiplied:
    ``residual + hidden_states`` becomes ``residual + hidden_states *
    self.<key>``. A parallel-residual sum ``attn_output + mlp_output +
    residual`` becomes ``(attn_output + mlp_output) * self.<key> + residual``.
    In the config file, the dataclass gets ``<key>: float = <default>``.

    The factor is a Python float read at build time; the value comes from the
    checkpoint's config (the spec field is an optional value: present or not).
    Runs after the codemods that restructure the residual blocks.

    Precondition: one ``<Prefix>DecoderLayer`` class taking ``config`` (in
    a model file of the package) whose forwards add a residual variable to
    something.
    """

    ID = "residual-multiplier"
    REALIZES = Realizes({"residual.multiplier": not_to(None)})
    Params = ResidualMultiplierParams
    FILES = ("model", "config", "module")
    AFTER = ("norm-placement", "parallel-residual")
    EXAMPLES = (
        Example(
            title="Granite",
            before="""
                class LlamaDecoderLayer(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.mlp = LlamaMLP(config)

                    def forward(self, hidden_states, positions):
                        residual = hidden_states
                        hidden_states = self.self_attn(self.input_layernorm(hidden_states), positions)
                        hidden_states = residual + hidden_states

                        residual = hidden_states
                        hidden_states = self.mlp(self.post_attention_layernorm(hidden_states))
                        return residual + hidden_states
            """,
            after="""
                class LlamaDecoderLayer(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.mlp = LlamaMLP(config)
                        self.residual_multiplier = config.residual_multiplier

                    def forward(self, hidden_states, positions):
                        residual = hidden_states
                        hidden_states = self.self_attn(self.input_layernorm(hidden_states), positions)
                        hidden_states = residual + hidden_states * self.residual_multiplier

                        residual = hidden_states
                        hidden_states = self.mlp(self.post_attention_layernorm(hidden_states))
                        return residual + hidden_states * self.residual_multiplier
            """,
        ),
        Example(
            title="the config field",
            role="config",
            path="config.py",
            before="""
                @dataclass
                class LlamaConfig:
                    hidden_size: int = 4096
                    torch_dtype: torch.dtype = torch.bfloat16
            """,
            after="""
                @dataclass
                class LlamaConfig:
                    hidden_size: int = 4096
                    # <-- MODEL-SPECIFIC: fields of this architecture's features (sorted by name)
                    # sublayer outputs times this before the residual add
                    residual_multiplier: float = 1.0
                    torch_dtype: torch.dtype = torch.bfloat16
            """,
        ),
        Example(
            title="no residual add",
            before="""
                class LlamaDecoderLayer(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.mlp = LlamaMLP(config)

                    def forward(self, hidden_states):
                        return self.mlp(hidden_states)
            """,
            raises="adds no residual variable",
        ),
        Example(
            title="a decode forward with an FP8 branch, and a prefill forward",
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
                        self.residual_multiplier = config.residual_multiplier

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
                        hidden_states = residual + hidden_states * self.residual_multiplier
                        hidden_states = _dp_transition(hidden_states, self.attn_dp_group, self.mlp_dp_group)
                        residual = hidden_states
                        hidden_states = self.post_attention_layernorm(hidden_states)
                        hidden_states = self.mlp(hidden_states, is_prefill=False)
                        return residual + hidden_states * self.residual_multiplier

                    def _forward_prefill(self, hidden_states, attn_metadata):
                        residual = hidden_states
                        hidden_states = self.input_layernorm(hidden_states)
                        hidden_states = self.self_attn(hidden_states, attn_metadata)
                        hidden_states = residual + hidden_states * self.residual_multiplier
                        residual = hidden_states
                        hidden_states = self.post_attention_layernorm(hidden_states)
                        hidden_states = self.mlp(hidden_states, is_prefill=True)
                        return residual + hidden_states * self.residual_multiplier
            """,
        ),
    )

    @classmethod
    def params_for(cls, diffs, target, port: PortContext) -> ResidualMultiplierParams:
        return ResidualMultiplierParams()

    def transform_module(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        key = self.params.config_key
        if ctx.role == "config":
            return config_scalar_edit(
                module,
                ctx,
                key,
                "float",
                self.params.default,
                "<-- MODEL-SPECIFIC: sublayer outputs times this before the residual add",
            )
        if ctx.role == "module":
            return other_model_file(module, ctx, self.touches(), "the residual multiplier")
        layer = class_here(module, ctx, "decoder_layer", "<Prefix>DecoderLayer")
        if layer is None:
            return module
        adds = [pair for forward in layer_forwards(layer) for pair in _residual_adds(forward)]
        if not adds:
            raise ctx.precondition(
                f"{self.ID}: {layer.name.value} adds no residual variable in its forwards "
                "(residual = hidden_states ... residual + hidden_states)",
                layer,
                module,
            )
        edits = init_reads_config(module, ctx, layer, key)
        for node, other_side in adds:
            other = getattr(node, other_side)
            if _is_scaled(other, key):
                continue
            edits[id(other)] = lambda updated, side=other_side: _scaled(updated, key, module)
        return rewrite(module, edits)


def _residual_adds(forward: cst.FunctionDef) -> list[tuple[cst.BinaryOperation, str]]:
    """Additions of a residual variable (a name assigned a plain copy of
    another: ``residual = hidden_states``) to something, in ``forward``:
    (addition, the side that is not the residual)."""
    residuals = set()
    for stmt in deep_statements(forward):
        pair = simple_assign(stmt)
        if pair is not None and isinstance(pair[0], cst.Name) and isinstance(pair[1], cst.Name):
            residuals.add(pair[0].value)
    adds = []
    for node in walk(forward):
        if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Add):
            if isinstance(node.left, cst.Name) and node.left.value in residuals:
                adds.append((node, "right"))
            elif isinstance(node.right, cst.Name) and node.right.value in residuals:
                adds.append((node, "left"))
    return adds


def _is_scaled(node: cst.CSTNode, key: str) -> bool:
    return (
        isinstance(node, cst.BinaryOperation)
        and isinstance(node.operator, cst.Multiply)
        and self_attr(node.right) == key
    )


def _scaled(node: cst.BaseExpression, key: str, module: cst.Module) -> cst.BaseExpression:
    code = cst.Module([]).code_for_node(node.with_changes(lpar=[], rpar=[]))
    if isinstance(node, cst.BinaryOperation) and not isinstance(node.operator, (cst.Multiply, cst.Divide)):
        code = f"({code})"
    return parse_expr(f"{code} * self.{key}", module)
