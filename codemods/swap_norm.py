"""swap-norm: RMSNorm <-> LayerNorm (with or without bias)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import libcst as cst

from autoport_cst.spec.pitfalls import Pitfall
from autoport_cst.transform import Codemod, Example, FileContext, PortContext
from autoport_cst.transform.anatomy.classes import defined_elsewhere, instances_of_role
from autoport_cst.transform.anatomy.mappings import entry_statement, mapping_entries
from autoport_cst.transform.cst.roles import split_prefix
from autoport_cst.transform.cst.snippets import parse_statement, parse_statements
from autoport_cst.transform.cst.vocabulary import (
    IS_ATTRIBUTE,
    classes_with_role,
    dotted,
    find_self_assignment,
    imported_names,
    is_call,
    is_docstring,
    keyword_arg,
    method,
    nodes_of,
    self_assignment,
    self_attr,
    statements,
    walk,
)
from autoport_cst.transform.edit.experts_norm import unfuse_norm_kernels
from autoport_cst.transform.edit.layer_guards import guard_fused_norms, other_model_file
from autoport_cst.transform.edit.scope_rename import rename_targets
from autoport_cst.transform.edit.tree import (
    insert_after,
    remove_statements,
    replace_method,
    replace_string_suffix,
    rewrite,
    with_statements,
)

SUFFIX = {"rmsnorm": "RMSNorm", "layernorm": "LayerNorm"}


@dataclass(frozen=True)
class SwapNormParams:
    kind: Literal["rmsnorm", "layernorm"] = field(
        default="layernorm", metadata={"doc": "The norm the port computes."}
    )
    bias: bool = field(default=False, metadata={"doc": "LayerNorm with an additive bias."})
    eps_key: str | None = field(
        default=None,
        metadata={
            "doc": "Config field holding the epsilon (`layer_norm_eps`, ...); default: keep.",
            "examples": ("layer_norm_eps", "rms_norm_eps"),
        },
    )
    fixed_eps: float | None = field(
        default=None,
        metadata={
            "doc": "The epsilon the model's code fixes (no config field): written as a literal at every "
            "use of the config's epsilon field, which leaves the config; default: read the config.",
            "examples": (1e-5,),
        },
    )


class SwapNorm(Codemod):
    """Switch the model's norm between RMSNorm and LayerNorm, with or without bias.

    In the model file, the norm class (``<Prefix>RMSNorm`` or
    ``<Prefix>LayerNorm``) is renamed to match what it computes, with every
    use; ``__init__`` gains or loses ``self.bias`` (zeros, shaped and typed
    like ``self.weight``); ``forward`` is rewritten to compute the chosen norm
    in float32 and cast back to the input dtype; and ``load_weights`` gains or
    loses a ``.bias`` mapping entry next to the ``.weight`` entry of every
    attribute that holds the norm (``input_layernorm``, ``norm``, ...).

    With ``eps_key``, the config field holding the epsilon is renamed in the
    config dataclass and at every ``config.<field>`` use, so that a checkpoint
    whose config calls it ``layer_norm_eps`` does not silently fall back to the
    default.

    With ``fixed_eps`` (the model's code fixes the epsilon: ``nn.LayerNorm(dim)``
    without ``eps``, or a literal), every ``config.<epsilon field>`` use becomes
    that literal and the field leaves the config dataclass, so that a
    checkpoint whose config.json holds an epsilon the model's code ignores
    (BioGPT's ``layer_norm_eps``) is not read.

    A fused RMSNorm kernel cannot compute a LayerNorm: with LayerNorm, every
    branch of the decoder layer that hands a norm's weight to a sublayer
    (``ln_w=self.input_layernorm.weight``: an FP8 kernel fusing the norm) is
    guarded (raises ``NotImplementedError``), and the other branches call the
    LayerNorm modules. A model in a module file built on the norm class (a
    drafter) imports it by its new name and is guarded: its own norms are not
    the port's.

    Preconditions: exactly one norm class (in a model file of the package);
    ``self.weight`` created as ``nn.Parameter(torch.ones(...))``; an epsilon
    attribute; no ``(1 + weight)`` offset in the current forward (a different
    norm this codemod does not produce); and no decode kernel call that fuses
    an RMSNorm (``rmsnorm_X_enabled``, the q/k norms) when switching to
    LayerNorm: the decode kernel computes every decode step, it cannot be
    guarded. The MoE decode kernel (``NF.moe_block_tkg``, which RMS-normalizes
    the experts' input with ``gamma``) can: with LayerNorm its experts class's
    ``self.fused_decode`` flag turns ``False``, so that decode runs the norm
    module, the router and the blockwise kernel (a class without the flag is
    refused at the call).
    """

    ID = "swap-norm"
    REALIZES = ("norm.kind", "norm.bias", "norm.eps_key", "norm.fixed_eps")
    Params = SwapNormParams
    PITFALLS = (
        Pitfall(
            10,
            lambda spec, facts: spec.norm.kind == "layernorm" or spec.norm.fixed_eps is not None,
            lambda spec, facts: _pitfall(spec),
        ),
    )
    FILES = ("model", "config", "module")
    EXAMPLES = (
        Example(
            title="RMSNorm to LayerNorm with bias",
            params={"kind": "layernorm", "bias": True, "eps_key": "layer_norm_eps"},
            before='''
                class LlamaRMSNorm(nn.Module):
                    """RMSNorm computed in float32, cast back to the input dtype."""

                    def __init__(self, hidden_size: int, eps: float, dtype: torch.dtype):
                        super().__init__()
                        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype))
                        self.variance_epsilon = eps

                    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
                        input_dtype = hidden_states.dtype
                        hidden_states = hidden_states.to(torch.float32)
                        variance = hidden_states.pow(2).mean(-1, keepdim=True)
                        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
                        return (self.weight * hidden_states).to(input_dtype)


                class LlamaModel(nn.Module):
                    def __init__(self, config):
                        self.norm = LlamaRMSNorm(config.hidden_size, config.rms_norm_eps, config.torch_dtype)

                    def load_weights(self, path):
                        mappings = {}
                        mappings["model.norm.weight"] = "model.norm.weight"
            ''',
            after='''
                class LlamaLayerNorm(nn.Module):
                    """LayerNorm with bias, computed in float32 and cast back to the input dtype."""

                    def __init__(self, hidden_size: int, eps: float, dtype: torch.dtype):
                        super().__init__()
                        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype))
                        self.bias = nn.Parameter(torch.zeros(hidden_size, dtype=dtype))
                        self.variance_epsilon = eps

                    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
                        input_dtype = hidden_states.dtype
                        hidden_states = hidden_states.to(torch.float32)
                        mean = hidden_states.mean(-1, keepdim=True)
                        variance = (hidden_states - mean).pow(2).mean(-1, keepdim=True)
                        hidden_states = (hidden_states - mean) * torch.rsqrt(variance + self.variance_epsilon)
                        return (self.weight * hidden_states + self.bias).to(input_dtype)


                class LlamaModel(nn.Module):
                    def __init__(self, config):
                        self.norm = LlamaLayerNorm(config.hidden_size, config.layer_norm_eps, config.torch_dtype)

                    def load_weights(self, path):
                        mappings = {}
                        mappings["model.norm.weight"] = "model.norm.weight"
                        mappings["model.norm.bias"] = "model.norm.bias"
            ''',
        ),
        Example(
            title="the config field holding the epsilon",
            role="config",
            path="config.py",
            params={"kind": "layernorm", "bias": True, "eps_key": "layer_norm_eps"},
            before="""
                @dataclass
                class LlamaConfig:
                    hidden_size: int = 4096
                    rms_norm_eps: float = 1e-5
            """,
            after="""
                @dataclass
                class LlamaConfig:
                    hidden_size: int = 4096
                    layer_norm_eps: float = 1e-5
            """,
        ),
        Example(
            title="an epsilon the model's code fixes (nn.LayerNorm(dim) without eps) is written as a literal",
            params={"kind": "layernorm", "bias": True, "eps_key": "layer_norm_eps", "fixed_eps": 1e-5},
            before="""
                class LlamaLayerNorm(nn.Module):
                    def __init__(self, hidden_size: int, eps: float, dtype: torch.dtype):
                        super().__init__()
                        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype))
                        self.bias = nn.Parameter(torch.zeros(hidden_size, dtype=dtype))
                        self.variance_epsilon = eps

                    def forward(self, x):
                        return x


                class LlamaDecoderLayer(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.input_layernorm = LlamaLayerNorm(config.hidden_size, config.norm_epsilon, config.torch_dtype)
                        self.rms_norm_eps = config.norm_epsilon
            """,
            after="""
                class LlamaLayerNorm(nn.Module):
                    def __init__(self, hidden_size: int, eps: float, dtype: torch.dtype):
                        super().__init__()
                        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype))
                        self.bias = nn.Parameter(torch.zeros(hidden_size, dtype=dtype))
                        self.variance_epsilon = eps

                    def forward(self, x):
                        return x


                class LlamaDecoderLayer(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.input_layernorm = LlamaLayerNorm(config.hidden_size, 1e-05, config.torch_dtype)
                        self.rms_norm_eps = 1e-05
            """,
        ),
        Example(
            title="a fixed epsilon leaves the config (config.json's epsilon is not read)",
            role="config",
            path="config.py",
            params={"kind": "layernorm", "bias": True, "eps_key": "layer_norm_eps", "fixed_eps": 1e-5},
            before="""
                @dataclass
                class LlamaConfig:
                    hidden_size: int = 4096
                    # the norm epsilon
                    norm_epsilon: float = 1e-5
                    tie_word_embeddings: bool = False
            """,
            after="""
                @dataclass
                class LlamaConfig:
                    hidden_size: int = 4096
                    tie_word_embeddings: bool = False
            """,
        ),
        Example(
            title="a (1 + weight) norm is not rewritten",
            params={"kind": "layernorm"},
            before="""
                class GemmaRMSNorm(nn.Module):
                    def __init__(self, dim, eps):
                        self.weight = nn.Parameter(torch.zeros(dim))
                        self.eps = eps

                    def forward(self, x):
                        return self._norm(x) * (1.0 + self.weight)
            """,
            raises="(1 + weight) offset",
        ),
        Example(
            title="a branch handing the norm's weight to a fused RMSNorm kernel is guarded",
            params={"kind": "layernorm", "bias": True, "eps_key": "layer_norm_eps"},
            before="""
                class LlamaRMSNorm(nn.Module):
                    def __init__(self, hidden_size: int, eps: float, dtype: torch.dtype):
                        super().__init__()
                        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype))
                        self.variance_epsilon = eps

                    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
                        input_dtype = hidden_states.dtype
                        hidden_states = hidden_states.to(torch.float32)
                        variance = hidden_states.pow(2).mean(-1, keepdim=True)
                        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
                        return (self.weight * hidden_states).to(input_dtype)


                class LlamaDecoderLayer(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.self_attn = attn_cls(config, layer_idx)
                        self.mlp = mlp_cls(config)
                        self.input_layernorm = LlamaRMSNorm(config.hidden_size, config.rms_norm_eps, config.torch_dtype)
                        self.post_attention_layernorm = LlamaRMSNorm(config.hidden_size, config.rms_norm_eps, config.torch_dtype)

                    def forward(self, hidden_states, attn_metadata):
                        residual = hidden_states
                        hidden_states = self.input_layernorm(hidden_states)
                        hidden_states = self.self_attn(hidden_states, attn_metadata)
                        hidden_states = residual + hidden_states
                        residual = hidden_states
                        if self.fp8:
                            hidden_states = self.mlp(hidden_states, ln_w=self.post_attention_layernorm.weight)
                        else:
                            hidden_states = self.post_attention_layernorm(hidden_states)
                            hidden_states = self.mlp(hidden_states)
                        return residual + hidden_states
            """,
            after="""
                class LlamaLayerNorm(nn.Module):
                    def __init__(self, hidden_size: int, eps: float, dtype: torch.dtype):
                        super().__init__()
                        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype))
                        self.bias = nn.Parameter(torch.zeros(hidden_size, dtype=dtype))
                        self.variance_epsilon = eps

                    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
                        input_dtype = hidden_states.dtype
                        hidden_states = hidden_states.to(torch.float32)
                        mean = hidden_states.mean(-1, keepdim=True)
                        variance = (hidden_states - mean).pow(2).mean(-1, keepdim=True)
                        hidden_states = (hidden_states - mean) * torch.rsqrt(variance + self.variance_epsilon)
                        return (self.weight * hidden_states + self.bias).to(input_dtype)


                class LlamaDecoderLayer(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.self_attn = attn_cls(config, layer_idx)
                        self.mlp = mlp_cls(config)
                        self.input_layernorm = LlamaLayerNorm(config.hidden_size, config.layer_norm_eps, config.torch_dtype)
                        self.post_attention_layernorm = LlamaLayerNorm(config.hidden_size, config.layer_norm_eps, config.torch_dtype)

                    def forward(self, hidden_states, attn_metadata):
                        residual = hidden_states
                        hidden_states = self.input_layernorm(hidden_states)
                        hidden_states = self.self_attn(hidden_states, attn_metadata)
                        hidden_states = residual + hidden_states
                        residual = hidden_states
                        if self.fp8:
                            raise NotImplementedError("LayerNorm: the FP8 kernels fuse an RMSNorm into the sublayer")
                        else:
                            hidden_states = self.post_attention_layernorm(hidden_states)
                            hidden_states = self.mlp(hidden_states)
                        return residual + hidden_states
            """,
        ),
        Example(
            title="a drafter in a module file, built on the norm class, is guarded",
            role="module",
            path="eagle3_model.py",
            package_classes=("LlamaDecoderLayer", "LlamaRMSNorm"),
            params={"kind": "layernorm", "bias": True, "eps_key": "layer_norm_eps"},
            before="""
                from .model import LlamaDecoderLayer, LlamaRMSNorm


                class DraftLlamaDecoderLayer(LlamaDecoderLayer):
                    def __init__(self, config, layer_idx):
                        super().__init__(config, layer_idx)
                        self.hidden_norm = LlamaRMSNorm(config.hidden_size, config.rms_norm_eps, config.torch_dtype)

                    def forward(self, embeds, hidden_states):
                        hidden_states = self.hidden_norm(hidden_states)
                        return self.mlp(hidden_states)
            """,
            after="""
                from .model import LlamaDecoderLayer, LlamaLayerNorm


                class DraftLlamaDecoderLayer(LlamaDecoderLayer):
                    def __init__(self, config, layer_idx):
                        raise NotImplementedError("layernorm norms: a model of this file is built on classes of the ported model that the change alters")
                        super().__init__(config, layer_idx)
                        self.hidden_norm = LlamaLayerNorm(config.hidden_size, config.rms_norm_eps, config.torch_dtype)

                    def forward(self, embeds, hidden_states):
                        hidden_states = self.hidden_norm(hidden_states)
                        return self.mlp(hidden_states)
            """,
        ),
    )

    @classmethod
    def check_params(cls, params: SwapNormParams) -> list[str]:
        if params.kind == "rmsnorm" and params.bias:
            return ["bias is only supported with kind 'layernorm'"]
        return []

    @classmethod
    def params_for(cls, diffs, target, port: PortContext) -> SwapNormParams:
        return SwapNormParams(
            kind=target.norm.kind,
            bias=target.norm.bias,
            eps_key=target.norm.eps_key,
            fixed_eps=target.norm.fixed_eps,
        )

    # -- model files -----------------------------------------------------------

    def transform_module(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        if ctx.role == "config":
            return self._transform_config(module, ctx)
        if ctx.role == "module":
            return self._other_model(module, ctx)
        if defined_elsewhere(module, ctx, "norm") and not instances_of_role(module, "norm"):
            # a file of sublayers beside the model file: only its fused kernels matter
            if self.params.kind == "layernorm":
                self._check_no_fused_rmsnorm(walk(module), module, ctx)
            return rewrite(module, self._eps_edits(walk(module)))
        norm = self._norm_class(module, ctx)
        old_name = norm.name.value
        prefix = old_name[: -len("LayerNorm" if old_name.endswith("LayerNorm") else "RMSNorm")]
        new_name = prefix + SUFFIX[self.params.kind]
        init = method(norm, "__init__")
        forward = method(norm, "forward")
        if init is None or forward is None:
            raise ctx.precondition(
                f"swap-norm: norm class {old_name} needs __init__ and forward", norm, module
            )
        if _has_unit_offset(forward):
            raise ctx.precondition(
                f"swap-norm: {old_name}.forward applies a (1 + weight) offset; "
                "swap-norm only produces plain RMSNorm or LayerNorm",
                forward,
                module,
            )
        weight = find_self_assignment(init, "weight")
        if weight is None or not _is_param_ctor(self_assignment(weight)[1], "ones"):
            raise ctx.precondition(
                f"swap-norm: {old_name}.__init__ must create self.weight = nn.Parameter(torch.ones(...))",
                init,
                module,
            )
        eps_attr = next(
            (a for s in statements(init) if (a := (self_assignment(s) or ("", None))[0]) and "eps" in a),
            None,
        )
        if eps_attr is None:
            raise ctx.precondition(
                f"swap-norm: no epsilon attribute (self.<...eps...> = ...) in {old_name}.__init__",
                init,
                module,
            )
        nodes = walk(module)
        edits: dict = {}
        guarded: set[int] = set()
        if self.params.kind == "layernorm":
            guards, blocks = guard_fused_norms(
                module, ctx, "LayerNorm: the FP8 kernels fuse an RMSNorm into the sublayer"
            )
            edits.update(guards)
            guarded = {id(n) for block in blocks for n in walk(block)}
            self._check_no_fused_rmsnorm([n for n in nodes if id(n) not in guarded], module, ctx)
            # the MoE decode kernel normalizes the experts' input with an RMSNorm: decode runs unfused
            unfuse_norm_kernels(self.ID, "the experts' norm is a LayerNorm", module, ctx, edits)

        current_bias = find_self_assignment(init, "bias") is not None
        if (old_name, current_bias) != (new_name, self.params.bias):
            new_norm = self._rewrite_norm(norm, init, forward, weight, eps_attr, module)
            new_norm = new_norm.with_changes(name=cst.Name(new_name))
            edits[id(norm)] = lambda updated: new_norm
            inside = {id(n) for n in walk(norm)} | guarded
            for target in rename_targets(module, {old_name: new_name}) - inside:
                edits[target] = lambda updated: updated.with_changes(value=new_name)
        edits.update(self._mapping_edits(nodes, old_name))
        edits.update(self._eps_edits(nodes))
        return rewrite(module, edits)

    def _eps_edits(self, nodes) -> dict:
        """Every ``config.<epsilon field>`` use: the fixed epsilon's literal,
        or the field's new name."""
        edits: dict = {}
        fixed, key = self.params.fixed_eps, self.params.eps_key
        for node in nodes:
            if not _is_eps_use(node):
                continue
            if fixed is not None:
                edits[id(node)] = lambda updated: cst.Float(repr(float(fixed)))
            elif key and node.attr.value != key:
                edits[id(node)] = lambda updated: updated.with_changes(attr=cst.Name(key))
        return edits

    def _other_model(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        """A module file whose models (a drafter) are built on the model's
        norm class and config: they import the class by its new name, and are
        guarded (their architecture keeps its own norms, which the class and
        the config's epsilon field no longer are)."""
        table = {}
        for local in imported_names(module):
            split = split_prefix(local)
            if split is not None and split[1] in SUFFIX.values() and local in ctx.port.package_classes:
                table[local] = split[0] + SUFFIX[self.params.kind]
        table = {old: new for old, new in table.items() if old != new}
        module = other_model_file(module, ctx, self.touches(), f"{self.params.kind} norms", guard=True)
        targets = rename_targets(module, table) if table else set()
        return rewrite(
            module, {t: (lambda updated: updated.with_changes(value=table[updated.value])) for t in targets}
        )

    def _norm_class(self, module: cst.Module, ctx: FileContext) -> cst.ClassDef:
        norms = [
            c for c in classes_with_role(module, "norm") if c.name.value.endswith(("RMSNorm", "LayerNorm"))
        ]
        if len(norms) != 1:
            found = ", ".join(c.name.value for c in norms) or "none"
            raise ctx.precondition(
                f"swap-norm: expected exactly one norm class named <Prefix>RMSNorm or "
                f"<Prefix>LayerNorm, found: {found}"
            )
        return norms[0]

    def _check_no_fused_rmsnorm(self, nodes, module: cst.Module, ctx: FileContext) -> None:
        """The decode kernel's fused norms are RMSNorms: with LayerNorm modules
        they would compute something else than prefill. A flag that is on only
        when the method is handed a norm weight (``rmsnorm_X_enabled=ln_w is
        not None``, ``ln_w`` a parameter defaulting to None) is fused only
        for the decoder-layer calls that hand one, which are guarded."""
        handed = _handed_params(nodes)
        for call in nodes:
            if not is_call(call, "NF.attention_decode"):
                continue
            for flag in ("rmsnorm_X_enabled", "rmsnorm_QK_pre_rope_enabled", "rmsnorm_QK_post_rope_enabled"):
                arg = keyword_arg(call, flag)  # type: ignore[arg-type]
                if (
                    arg is None
                    or dotted(arg.value) == "False"
                    or _handed(arg.value, handed.get(id(call), ()))
                ):
                    continue
                raise ctx.precondition(
                    f"swap-norm: NF.attention_decode fuses an RMSNorm ({flag}); "
                    "apply the LayerNorm modules outside the kernel instead",
                    call,
                    module,
                )

    def _rewrite_norm(self, norm, init, forward, weight, eps_attr, module):
        kind, bias = self.params.kind, self.params.bias
        # __init__: add or remove self.bias
        new_init = init
        existing_bias = find_self_assignment(init, "bias")
        if bias and existing_bias is None:
            weight_value = self_assignment(weight)[1]
            bias_value = _with_ctor(weight_value, "zeros")
            small = weight.body[0]
            bias_stmt = weight.with_changes(
                body=[
                    small.with_changes(
                        targets=[small.targets[0].with_changes(target=cst.parse_expression("self.bias"))],
                        value=bias_value,
                    )
                ],
                leading_lines=[],
            )
            new_init = insert_after(init, weight, [bias_stmt])
        elif not bias and existing_bias is not None:
            new_init = remove_statements(init, [existing_bias])
        # forward: the chosen computation
        params = forward.params.params
        if len(params) < 2:
            raise ValueError("forward takes no input")
        x = params[1].name.value
        body = parse_statements(_forward_code(x, eps_attr, kind, bias), module)
        new_forward = with_statements(forward, body)
        new_norm = replace_method(replace_method(norm, init, new_init), forward, new_forward)
        # docstring
        doc = _docstring(kind, bias)
        first = new_norm.body.body[0]
        if is_docstring(first):
            new_norm = new_norm.with_changes(
                body=new_norm.body.with_changes(
                    body=[
                        parse_statement(doc, module).with_changes(leading_lines=first.leading_lines),
                        *new_norm.body.body[1:],
                    ]
                )
            )
        return new_norm

    def _mapping_edits(self, nodes, norm_name: str) -> dict:
        """Add (or remove) the ``.bias`` mapping entry next to the ``.weight``
        entry of every attribute that holds the norm."""
        attrs = set()
        for node in nodes:
            found = self_assignment(node) if type(node) is cst.SimpleStatementLine else None
            if found and isinstance(found[1], cst.Call) and dotted(found[1].func) == norm_name:
                attrs.add(found[0])
        if not attrs:
            return {}
        entries = mapping_entries(nodes)
        keys = {e.key for e in entries}

        def is_norm_key(key: str, leaf: str) -> bool:
            return any(key == f"{a}.{leaf}" or key.endswith(f".{a}.{leaf}") for a in attrs)

        edits = {}
        for entry in entries:
            if self.params.bias and is_norm_key(entry.key, "weight"):
                if entry.key[: -len("weight")] + "bias" in keys:
                    continue
                key = replace_string_suffix(entry.key_node, ".weight", ".bias")
                value = replace_string_suffix(entry.value, ".weight", ".bias")
                if key is not None and value is not None:
                    new = entry_statement(entry, key, value)
                    edits[id(entry.statement)] = lambda updated, new=new: cst.FlattenSentinel([updated, new])
            elif not self.params.bias and is_norm_key(entry.key, "bias"):
                edits[id(entry.statement)] = lambda updated: cst.RemoveFromParent()
        return edits

    # -- config file -----------------------------------------------------------

    def _transform_config(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        if not self.params.eps_key and self.params.fixed_eps is None:
            return module
        configs = classes_with_role(module, "config")
        if not configs:
            raise ctx.precondition("swap-norm: no config class (<Prefix>Config) in the config file")
        config = configs[0]
        eps_fields = [
            s
            for s in config.body.body
            if isinstance(s, cst.SimpleStatementLine)
            and isinstance(s.body[0], cst.AnnAssign)
            and isinstance(s.body[0].target, cst.Name)
            and _is_eps_name(s.body[0].target.value)
        ]
        if not eps_fields and self.params.fixed_eps is not None:
            return module  # the config reads no epsilon
        if len(eps_fields) != 1:
            raise ctx.precondition(
                f"swap-norm: expected one epsilon field in {config.name.value}, found {len(eps_fields)}",
                config,
                module,
            )
        stmt = eps_fields[0]
        ann = stmt.body[0]
        if self.params.fixed_eps is not None:
            body = [s for s in config.body.body if s is not stmt]
        elif ann.target.value == self.params.eps_key:
            return module
        else:
            new_stmt = stmt.with_changes(body=[ann.with_changes(target=cst.Name(self.params.eps_key))])
            body = [new_stmt if s is stmt else s for s in config.body.body]
        new_config = config.with_changes(body=config.body.with_changes(body=body))
        return module.with_changes(body=[new_config if s is config else s for s in module.body])


def _pitfall(spec) -> str:
    if spec.norm.fixed_eps is not None:
        eps = (
            f"write the epsilon the model's code fixes ({spec.norm.fixed_eps:g}) as a literal: "
            "config.json's epsilon field is not what it computes with"
        )
    else:
        eps = f"read the epsilon from config.{spec.norm.eps_key} everywhere (QK-norm eps included)"
    if spec.norm.kind != "layernorm":
        return eps[0].upper() + eps[1:]
    return f"LayerNorm: keep the decode kernel's fused RMSNorm off, subtract the mean in float32, and {eps}"


def _handed_params(nodes) -> dict[int, tuple[str, ...]]:
    """id(call) -> the parameters defaulting to None of the function around it."""
    found: dict[int, tuple[str, ...]] = {}
    for func in nodes:
        if type(func) is cst.FunctionDef:  # (no subclasses: the abstract-class isinstance is slow)
            names = tuple(
                p.name.value
                for p in func.params.params
                if p.default is not None and dotted(p.default) == "None"
            )
            for node in nodes_of(func, cst.Call):
                found[id(node)] = names  # inner functions come later and win
    return found


def _handed(value: cst.BaseExpression, params: tuple[str, ...]) -> bool:
    """``<param> is not None`` for one of ``params``."""
    return (
        isinstance(value, cst.Comparison)
        and isinstance(value.left, cst.Name)
        and value.left.value in params
        and len(value.comparisons) == 1
        and isinstance(value.comparisons[0].operator, cst.IsNot)
        and dotted(value.comparisons[0].comparator) == "None"
    )


def _is_eps_name(name: str) -> bool:
    return "eps" in name and "norm" in name


def _is_eps_use(node: cst.CSTNode) -> bool:
    """``<...config>.<norm eps field>``, such as ``config.rms_norm_eps``."""
    return (
        IS_ATTRIBUTE[type(node)]
        and _is_eps_name(node.attr.value)
        and (dotted(node.value) or "").split(".")[-1] == "config"
    )


def _is_param_ctor(value: cst.BaseExpression, ctor: str) -> bool:
    return (
        isinstance(value, cst.Call)
        and dotted(value.func) in ("nn.Parameter", "torch.nn.Parameter", "Parameter")
        and bool(value.args)
        and isinstance(value.args[0].value, cst.Call)
        and (dotted(value.args[0].value.func) or "").endswith(ctor)
    )


def _with_ctor(value: cst.Call, ctor: str) -> cst.Call:
    inner = value.args[0].value
    func = inner.func
    new_func = func.with_changes(attr=cst.Name(ctor)) if isinstance(func, cst.Attribute) else cst.Name(ctor)
    new_inner = inner.with_changes(func=new_func)
    return value.with_changes(args=[value.args[0].with_changes(value=new_inner), *value.args[1:]])


def _is_weight(node: cst.CSTNode) -> bool:
    """``self.weight``, possibly cast: ``self.weight.float()``, ``self.weight.to(x)``."""
    while isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute):
        node = node.func.value
    return self_attr(node) == "weight"


def _has_unit_offset(forward: cst.FunctionDef) -> bool:
    for node in walk(forward):
        if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Add):
            sides = (node.left, node.right)
            if any(_is_weight(s) for s in sides) and any(
                isinstance(s, (cst.Integer, cst.Float)) and float(s.value) == 1.0 for s in sides
            ):
                return True
    return False


def _docstring(kind: str, bias: bool) -> str:
    if kind == "layernorm":
        what = "LayerNorm with bias" if bias else "LayerNorm without bias"
        return f'"""{what}, computed in float32 and cast back to the input dtype."""'
    return '"""RMSNorm computed in float32, cast back to the input dtype."""'


def _forward_code(x: str, eps: str, kind: str, bias: bool) -> str:
    lines = [f"input_dtype = {x}.dtype", f"{x} = {x}.to(torch.float32)"]
    if kind == "layernorm":
        lines += [
            f"mean = {x}.mean(-1, keepdim=True)",
            f"variance = ({x} - mean).pow(2).mean(-1, keepdim=True)",
            f"{x} = ({x} - mean) * torch.rsqrt(variance + self.{eps})",
        ]
    else:
        lines += [
            f"variance = {x}.pow(2).mean(-1, keepdim=True)",
            f"{x} = {x} * torch.rsqrt(variance + self.{eps})",
        ]
    scaled = f"self.weight * {x} + self.bias" if bias else f"self.weight * {x}"
    lines.append(f"return ({scaled}).to(input_dtype)")
    return "\n".join(lines) + "\n"
