"""weightless-qk-norm: per-head q/k norms without a learned weight, on every layer or the RoPE layers (Llama 4)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import libcst as cst

from autoport_cst.spec.pitfalls import Pitfall
from autoport_cst.transform import Codemod, Example, FileContext, PortContext
from autoport_cst.transform.anatomy.attention import attention_classes_in
from autoport_cst.transform.anatomy.classes import require_method
from autoport_cst.transform.cst.snippets import parse_expr, parse_statement
from autoport_cst.transform.cst.vocabulary import (
    code_of,
    find_self_assignment,
    is_none,
    walk,
)
from autoport_cst.transform.edit.mappings import mapping_entries_of_attr
from autoport_cst.transform.edit.tree import removal_edits, rewrite, with_comment
from autoport_cst.transform.realizes import ANY, Realizes, to

ID = "weightless-qk-norm"
NORMS = ("q_norm", "k_norm")
# kernel arguments switching a fused q/k norm on: decode flags, prefill norm types
DECODE_FLAGS = ("rmsnorm_QK_pre_rope_enabled", "rmsnorm_QK_post_rope_enabled")
PREFILL_TYPES = tuple(f"qk_norm_{stage}_rope_{n}" for stage in ("pre", "post") for n in NORMS)
COMMENT = "<-- MODEL-SPECIFIC: q/k norms without a learned weight (x * rsqrt(mean(x^2) + eps)); "


@dataclass(frozen=True)
class WeightlessQkNormParams:
    layers: Literal["all", "rope"] = field(
        default="all",
        metadata={
            "doc": "all: every layer; rope: the layers with RoPE only (_layer_uses_rope, nope-layers)."
        },
    )


class WeightlessQkNorm(Codemod):
    """Per-head q/k norms without a learned weight, ``x * rsqrt(mean(x^2) + eps)``, on every layer or the RoPE layers only (Llama 4's L2 norm).

    The reference's per-head q/k RMSNorms (``self.q_norm`` / ``self.k_norm``,
    a ``qwen3``-family reference) lose their weights, and with
    ``layers="rope"`` they apply on the layers that rotate their queries and
    keys only (``_layer_uses_rope``, which nope-layers adds; Llama 4's ``if
    use_qk_norm and use_rope``). In the attention class:

    - ``__init__``: the two norm modules give way to ``self.qk_norm_eps``
      (the epsilon they were built with) and ``self.use_qk_norm`` (True, or
      the layer's ``_layer_uses_rope``);
    - every kernel argument that hands a norm weight
      (``self.q_norm.weight.view(1, -1)``, a ``qk_norm_*_gamma`` or
      ``rmsnorm_QK_*_W_Q``) becomes None (the kernels then normalise without
      scaling), every epsilon read ``self.qk_norm_eps``;
    - the decode kernels' norm flags (``rmsnorm_QK_*_rope_enabled=True``)
      and the prefill projection's norm types (``qk_norm_*_rope_q_norm``)
      are on only where ``self.use_qk_norm``;
    - loaders attached to the weights (``set_weight_loader(self.q_norm.weight,
      ...)``) go.

    In ``load_weights`` the ``q_norm`` / ``k_norm`` entries go: the checkpoint
    has no tensor for them. Where the norms apply (before or after RoPE) is
    qk-norm-position's; this codemod runs after it.

    Preconditions: an attention class with both norms, built with an
    epsilon (a keyword holding ``eps`` or the second positional argument),
    read only as above (a norm called on q or k, or any other read, is
    refused with its position); with ``layers="rope"`` the module defines
    ``_layer_uses_rope`` and ``__init__`` takes ``(self, config,
    layer_idx)``.
    """

    ID = ID
    REALIZES = Realizes({"attention.qk_norm_affine": to(False), "attention.qk_norm_layers": ANY})
    AFTER = ("qk-norm", "qk-norm-position", "interleaved-rope", "nope-layers", "position-scaled-attention")
    Params = WeightlessQkNormParams
    NEEDS_REAL_MODEL = True
    PITFALLS = (
        Pitfall(
            63,
            lambda spec, facts: spec.attention.qk_norm != "none" and not spec.attention.qk_norm_affine,
            lambda spec, facts: (
                "q/k norms without a learned weight"
                + (" on the RoPE layers only" if spec.attention.qk_norm_layers == "rope" else "")
                + ": no checkpoint tensor to load, no gamma handed to the kernels"
            ),
        ),
    )
    FILES = ("model",)
    EXAMPLES = (
        Example(
            title="Llama 4: no weight, the RoPE layers only, after RoPE",
            params={"layers": "rope"},
            before="""
                def _layer_uses_rope(config, layer_idx: int) -> bool:
                    ...


                class Llama4TextAttention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.qkv_proj_weight = nn.Parameter(torch.empty(8, 24, dtype=self.dtype))
                        # <-- MODEL-SPECIFIC: per-head RMSNorm of queries and keys before RoPE
                        self.q_norm = Llama4TextRMSNorm(self.head_dim, config.rms_norm_eps, self.dtype)
                        self.k_norm = Llama4TextRMSNorm(self.head_dim, config.rms_norm_eps, self.dtype)
                        self._setup_weight_loaders()

                    def _setup_weight_loaders(self):
                        set_weight_loader(self.q_norm.weight, get_weight_loader(self.q_norm.weight))

                    def forward_prefill(self, x, cos, sin):
                        return NF.qkv_proj(
                            hidden=x,
                            qk_norm_post_rope_q_norm=NormType.RMS_NORM,
                            qk_norm_post_rope_k_norm=NormType.RMS_NORM,
                            qk_norm_post_rope_eps=self.q_norm.variance_epsilon,
                            qk_norm_post_rope_q_gamma=self.q_norm.weight.view(1, -1),
                            qk_norm_post_rope_k_gamma=self.k_norm.weight.view(1, -1),
                        )

                    def forward_decode(self, x):
                        return NF.attention_decode(
                            X=x,
                            rmsnorm_QK_pre_rope_enabled=False,
                            rmsnorm_QK_post_rope_enabled=True,
                            rmsnorm_QK_post_rope_eps=self.q_norm.variance_epsilon,
                            rmsnorm_QK_post_rope_W_Q=self.q_norm.weight.view(1, -1),
                            rmsnorm_QK_post_rope_W_K=self.k_norm.weight.view(1, -1),
                        )


                class Llama4TextForCausalLM(nn.Module):
                    def load_weights(self, path):
                        for layer_id in range(2):
                            prefix = f"model.layers.{layer_id}"
                            mappings[f"{prefix}.self_attn.q_norm.weight"] = f"{prefix}.self_attn.q_norm.weight"
                            mappings[f"{prefix}.self_attn.k_norm.weight"] = f"{prefix}.self_attn.k_norm.weight"
                            mappings[f"{prefix}.input_layernorm.weight"] = f"{prefix}.input_layernorm.weight"
            """,
            after="""
                def _layer_uses_rope(config, layer_idx: int) -> bool:
                    ...


                class Llama4TextAttention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.qkv_proj_weight = nn.Parameter(torch.empty(8, 24, dtype=self.dtype))
                        # <-- MODEL-SPECIFIC: q/k norms without a learned weight (x * rsqrt(mean(x^2) + eps)); on the RoPE layers only
                        self.qk_norm_eps = config.rms_norm_eps
                        self.use_qk_norm = _layer_uses_rope(config, layer_idx)
                        self._setup_weight_loaders()

                    def _setup_weight_loaders(self):
                        pass

                    def forward_prefill(self, x, cos, sin):
                        return NF.qkv_proj(
                            hidden=x,
                            qk_norm_post_rope_q_norm=NormType.RMS_NORM if self.use_qk_norm else None,
                            qk_norm_post_rope_k_norm=NormType.RMS_NORM if self.use_qk_norm else None,
                            qk_norm_post_rope_eps=self.qk_norm_eps,
                            qk_norm_post_rope_q_gamma=None,
                            qk_norm_post_rope_k_gamma=None,
                        )

                    def forward_decode(self, x):
                        return NF.attention_decode(
                            X=x,
                            rmsnorm_QK_pre_rope_enabled=False,
                            rmsnorm_QK_post_rope_enabled=self.use_qk_norm,
                            rmsnorm_QK_post_rope_eps=self.qk_norm_eps,
                            rmsnorm_QK_post_rope_W_Q=None,
                            rmsnorm_QK_post_rope_W_K=None,
                        )


                class Llama4TextForCausalLM(nn.Module):
                    def load_weights(self, path):
                        for layer_id in range(2):
                            prefix = f"model.layers.{layer_id}"
                            mappings[f"{prefix}.input_layernorm.weight"] = f"{prefix}.input_layernorm.weight"
            """,
        ),
        Example(
            title="norm weights held as parameters the kernels read (the production packages)",
            params={"layers": "rope"},
            before="""
                class Llama4TextAttention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.qkv_proj_weight = nn.Parameter(torch.empty(8, 24, dtype=self.dtype))
                        self.q_norm_weight = nn.Parameter(torch.empty(self.head_dim, dtype=torch.float32))
                        self.k_norm_weight = nn.Parameter(torch.empty(self.head_dim, dtype=torch.float32))

                    def forward_prefill(self, x):
                        return NF.qkv_proj(hidden=x, qk_norm_pre_rope_q_gamma=self.q_norm_weight)
            """,
            raises="holds its q/k norm weights as parameters",
        ),
        Example(
            title="a norm called on the queries (not fused in a kernel)",
            before="""
                class Qwen3Attention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.qkv_proj_weight = nn.Parameter(torch.empty(8, 24, dtype=self.dtype))
                        self.q_norm = Qwen3RMSNorm(self.head_dim, config.rms_norm_eps, self.dtype)
                        self.k_norm = Qwen3RMSNorm(self.head_dim, config.rms_norm_eps, self.dtype)

                    def forward_prefill(self, q, k):
                        q = self.q_norm(q)
                        k = self.k_norm(k)
                        return q, k
            """,
            raises="reads self.q_norm other than",
        ),
    )

    @classmethod
    def params_for(cls, diffs, target, port: PortContext) -> WeightlessQkNormParams:
        return WeightlessQkNormParams(layers=target.attention.qk_norm_layers)

    def transform_module(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        edits: dict = {}
        doomed: list[cst.CSTNode] = []
        classes = attention_classes_in(module, ctx)
        for cls in classes:
            doomed += self._attention_edits(cls, module, ctx, edits)
        if not classes:
            return module
        for norm in NORMS:
            doomed += [e.statement for e in mapping_entries_of_attr(module, norm)]
        edits.update(removal_edits(module, doomed))
        return rewrite(module, edits)

    def _attention_edits(self, cls: cst.ClassDef, module, ctx: FileContext, edits: dict) -> list[cst.CSTNode]:
        name = cls.name.value
        init = require_method(module, ctx, cls, "__init__")
        built = [find_self_assignment(init, norm) for norm in NORMS]
        if built[0] is None and built[1] is None:
            if find_self_assignment(init, "qk_norm_eps") is not None:
                return []  # weightless already
            held = [s for norm in NORMS if (s := find_self_assignment(init, f"{norm}_weight")) is not None]
            if held:  # the production packages' shape: parameters handed to the kernels
                raise ctx.precondition(
                    f"{ID}: {name} holds its q/k norm weights as parameters (self.q_norm_weight / "
                    "self.k_norm_weight, handed to the kernels), not as norm modules self.q_norm / "
                    "self.k_norm: not handled",
                    held[0],
                    module,
                )
            raise ctx.precondition(f"{ID}: {name}.__init__ builds no self.q_norm / self.k_norm", init, module)
        if built[0] is None or built[1] is None:
            raise ctx.precondition(f"{ID}: {name}.__init__ builds only one of q_norm / k_norm", init, module)
        eps = _epsilon(built[0])
        if eps is None:
            raise ctx.precondition(
                f"{ID}: {name}.q_norm is built without an epsilon it can keep", built[0], module
            )
        enabled = "True"
        if self.params.layers == "rope":
            params = [p.name.value for p in init.params.params]
            has_rule = any(
                isinstance(s, cst.FunctionDef) and s.name.value == "_layer_uses_rope" for s in module.body
            )
            if len(params) < 3 or not has_rule:
                raise ctx.precondition(
                    f"{ID}: the RoPE layers of {name} are not known here (_layer_uses_rope and "
                    "__init__(self, config, layer_idx) needed)",
                    init,
                    module,
                )
            enabled = f"_layer_uses_rope({params[1]}, {params[2]})"
        where = "on the RoPE layers only" if self.params.layers == "rope" else "on every layer"
        first = with_comment(parse_statement(f"self.qk_norm_eps = {eps}", module), COMMENT + where)
        second = parse_statement(f"self.use_qk_norm = {enabled}", module)
        # the reference's comment on its norms gives way to this one
        edits[id(built[0])] = lambda updated: cst.FlattenSentinel(
            [
                first.with_changes(
                    leading_lines=[
                        *(line for line in updated.leading_lines if line.comment is None),
                        *first.leading_lines,
                    ]
                ),
                second,
            ]
        )
        doomed: list[cst.CSTNode] = [built[1]]
        handled = {id(n) for b in built for n in walk(b)}
        for method in cls.body.body:
            if not isinstance(method, cst.FunctionDef) or method is init:
                continue
            doomed += self._method_edits(method, name, module, ctx, edits, handled)
        self._refuse_other_reads(cls, name, module, ctx, handled)
        return doomed

    def _method_edits(self, method, name, module, ctx, edits, handled: set[int]) -> list[cst.CSTNode]:
        doomed = []
        for stmt in walk(method):
            if isinstance(stmt, cst.SimpleStatementLine) and "set_weight_loader(" in code_of(stmt):
                if any(f"self.{norm}.weight" in code_of(stmt) for norm in NORMS):
                    doomed.append(stmt)
                    handled.update(id(n) for n in walk(stmt))
        for arg in walk(method):
            if not isinstance(arg, cst.Arg) or arg.keyword is None:
                continue
            key, text = arg.keyword.value, code_of(arg.value)
            if any(text.startswith(f"self.{norm}.weight") for norm in NORMS):
                edits[id(arg)] = lambda updated: updated.with_changes(value=cst.Name("None"))
            elif any(text == f"self.{norm}.variance_epsilon" for norm in NORMS):
                edits[id(arg)] = lambda updated: updated.with_changes(value=parse_expr("self.qk_norm_eps"))
            elif key in DECODE_FLAGS and text == "True":
                edits[id(arg)] = lambda updated: updated.with_changes(value=parse_expr("self.use_qk_norm"))
            elif key in PREFILL_TYPES and not is_none(arg.value):
                value = parse_expr(f"{text} if self.use_qk_norm else None")
                edits[id(arg)] = lambda updated, value=value: updated.with_changes(value=value)
            else:
                continue
            handled.update(id(n) for n in walk(arg))
        return doomed

    def _refuse_other_reads(self, cls, name, module, ctx, handled: set[int]) -> None:
        for node in walk(cls):
            if id(node) in handled or not isinstance(node, cst.Attribute):
                continue
            for norm in NORMS:
                if code_of(node) == f"self.{norm}":
                    raise ctx.precondition(
                        f"{ID}: {name} reads self.{norm} other than as a kernel's weight or epsilon",
                        node,
                        module,
                    )


def _epsilon(stmt: cst.SimpleStatementLine) -> str | None:
    """The code of the epsilon a norm is built with."""
    value = stmt.body[0].value if isinstance(stmt.body[0], cst.Assign) else None
    if not isinstance(value, cst.Call):
        return None
    for arg in value.args:
        if arg.keyword is not None and "eps" in arg.keyword.value:
            return code_of(arg.value)
    positional = [a for a in value.args if a.keyword is None and not a.star]
    return code_of(positional[1].value) if len(positional) > 1 else None
