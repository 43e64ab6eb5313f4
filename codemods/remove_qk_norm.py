"""remove-qk-norm: drop the per-head RMSNorm of queries and keys."""

from __future__ import annotations

import libcst as cst

from autoport_cst.transform import Codemod, Example, FileContext
from autoport_cst.transform.anatomy.mappings import mapping_entries
from autoport_cst.transform.anatomy.qkv import projection_kind
from autoport_cst.transform.cst.roles import class_role
from autoport_cst.transform.cst.snippets import parse_expr
from autoport_cst.transform.cst.vocabulary import (
    classes_with_role,
    is_call,
    keyword_arg,
    self_assignment,
    self_attr,
    simple_assign,
    walk,
)
from autoport_cst.transform.edit.arguments import remove_keyword, set_keyword
from autoport_cst.transform.edit.tree import rewrite
from autoport_cst.transform.realizes import Realizes, from_to

NORMS = ("q_norm", "k_norm")
DECODE_NORM_ARGS = tuple(
    f"rmsnorm_QK_{stage}_rope_{arg}" for stage in ("pre", "post") for arg in ("eps", "W_Q", "W_K")
)
DECODE_NORM_FLAGS = ("rmsnorm_QK_pre_rope_enabled", "rmsnorm_QK_post_rope_enabled")
PREFILL_NORM_ARGS = tuple(
    f"qk_norm_{stage}_rope_{arg}"
    for stage in ("pre", "post")
    for arg in ("q_norm", "k_norm", "eps", "q_gamma", "k_gamma", "q_beta", "k_beta")
)


class RemoveQkNorm(Codemod):
    """Remove the per-head RMSNorm of queries and keys (Qwen3 -> Llama/Mixtral attention).

    The reverse of adding a QK-norm, for references that have one (the
    ``qwen3_moe`` reference) and targets that do not. In the attention class
    (``<Prefix>Attention``):

    - ``__init__``: the ``self.q_norm = ...`` and ``self.k_norm = ...``
      modules go (with the comment above them);
    - prefill: the statements applying them (``q = self.q_norm(q)``) go; a
      ``NF.qkv_proj`` that fuses them loses its ``qk_norm_pre_rope_*`` (or
      ``qk_norm_post_rope_*``) arguments, on every prefill path;
    - loaders attached to their gammas
      (``set_weight_loader(self.q_norm.weight, ...)``, as a RoPE column
      reordering adds) go with them;
    - decode: every ``NF.attention_decode`` call (or its op-by-op substitute)
      gets ``rmsnorm_QK_pre_rope_enabled=False`` (and the post-RoPE flag
      False) and loses the norm's eps and gamma arguments.

    In ``load_weights`` the ``...q_norm.weight`` / ``...k_norm.weight``
    entries go.

    Preconditions: an attention class; when it has ``self.q_norm`` it has
    ``self.k_norm`` too, and every other read of them is one of the forms
    above (a use it cannot remove is an error naming its position). An
    attention class already without QK-norm is left as it is.
    """

    ID = "remove-qk-norm"
    REALIZES = Realizes({"attention.qk_norm": from_to("per_head", "none")})
    EXAMPLES = (
        Example(
            title="Qwen3-style QK-norm removed",
            before="""
                class Qwen3MoeAttention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.qkv_proj_weight = nn.Parameter(torch.empty(8, 24, dtype=self.dtype))
                        # <-- MODEL-SPECIFIC: per-head RMSNorm of queries and keys before RoPE
                        self.q_norm = Qwen3MoeRMSNorm(self.head_dim, config.rms_norm_eps, self.dtype)
                        self.k_norm = Qwen3MoeRMSNorm(self.head_dim, config.rms_norm_eps, self.dtype)
                        self.k_cache = None

                    def forward_prefill(self, q, k):
                        # <-- MODEL-SPECIFIC: per-head RMSNorm of queries and keys before RoPE
                        q = self.q_norm(q)
                        k = self.k_norm(k)
                        return q, k

                    def forward_decode(self, x):
                        return NF.attention_decode(
                            X=x,
                            rmsnorm_QK_pre_rope_enabled=True,
                            rmsnorm_QK_pre_rope_eps=self.q_norm.variance_epsilon,
                            rmsnorm_QK_pre_rope_W_Q=self.q_norm.weight.view(1, -1),
                            rmsnorm_QK_pre_rope_W_K=self.k_norm.weight.view(1, -1),
                            softmax_scale=self.scaling,
                        )


                class Qwen3MoeForCausalLM(nn.Module):
                    def load_weights(self, path):
                        for layer_id in range(2):
                            prefix = f"model.layers.{layer_id}"
                            mappings[f"{prefix}.self_attn.q_norm.weight"] = f"{prefix}.self_attn.q_norm.weight"
                            mappings[f"{prefix}.self_attn.k_norm.weight"] = f"{prefix}.self_attn.k_norm.weight"
                            mappings[f"{prefix}.input_layernorm.weight"] = f"{prefix}.input_layernorm.weight"
            """,
            after="""
                class Qwen3MoeAttention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.qkv_proj_weight = nn.Parameter(torch.empty(8, 24, dtype=self.dtype))
                        self.k_cache = None

                    def forward_prefill(self, q, k):
                        return q, k

                    def forward_decode(self, x):
                        return NF.attention_decode(
                            X=x,
                            rmsnorm_QK_pre_rope_enabled=False,
                            softmax_scale=self.scaling,
                        )


                class Qwen3MoeForCausalLM(nn.Module):
                    def load_weights(self, path):
                        for layer_id in range(2):
                            prefix = f"model.layers.{layer_id}"
                            mappings[f"{prefix}.input_layernorm.weight"] = f"{prefix}.input_layernorm.weight"
            """,
        ),
        Example(
            title="loaders another codemod put on the norm gammas go with the norms",
            before="""
                class Qwen3MoeAttention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.q_norm = Qwen3MoeRMSNorm(self.head_dim, config.rms_norm_eps, self.dtype)
                        self.k_norm = Qwen3MoeRMSNorm(self.head_dim, config.rms_norm_eps, self.dtype)
                        self._setup_weight_loaders()

                    def _setup_weight_loaders(self):
                        set_weight_loader(self.qkv_proj_weight, fused_qkv_weight_loader(q_size=self.q_size))
                        set_weight_loader(
                            self.q_norm.weight,
                            _rope_columns_loader(get_weight_loader(self.q_norm.weight), self.rope_column_order, self.head_dim),
                        )
                        set_weight_loader(
                            self.k_norm.weight,
                            _rope_columns_loader(get_weight_loader(self.k_norm.weight), self.rope_column_order, self.head_dim),
                        )
            """,
            after="""
                class Qwen3MoeAttention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self._setup_weight_loaders()

                    def _setup_weight_loaders(self):
                        set_weight_loader(self.qkv_proj_weight, fused_qkv_weight_loader(q_size=self.q_size))
            """,
        ),
        Example(
            title="norms fused into every projection (real vllm_neuron shape)",
            before="""
                class Qwen3MoeAttention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.head_dim = config.head_dim
                        self.q_norm = Qwen3MoeRMSNorm(self.head_dim, config.rms_norm_eps, self.dtype)
                        self.k_norm = Qwen3MoeRMSNorm(self.head_dim, config.rms_norm_eps, self.dtype)

                    def forward_prefill(self, x, cos, sin, kv_segment_size):
                        if kv_segment_size:
                            q, _, _ = NF.qkv_proj(
                                hidden=x,
                                cos_cache=cos,
                                sin_cache=sin,
                                use_block_kv=True,
                                qk_norm_pre_rope_q_norm=NormType.RMS_NORM,
                                qk_norm_pre_rope_k_norm=NormType.RMS_NORM,
                                qk_norm_pre_rope_eps=self.q_norm.variance_epsilon,
                                qk_norm_pre_rope_q_gamma=self.q_norm.weight.view(1, -1),
                                qk_norm_pre_rope_k_gamma=self.k_norm.weight.view(1, -1),
                            )
                        else:
                            q = NF.qkv_proj(hidden=x, cos_cache=cos, sin_cache=sin, qk_norm_post_rope_eps=self.q_norm.variance_epsilon)
                        return q
            """,
            after="""
                class Qwen3MoeAttention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.head_dim = config.head_dim

                    def forward_prefill(self, x, cos, sin, kv_segment_size):
                        if kv_segment_size:
                            q, _, _ = NF.qkv_proj(
                                hidden=x,
                                cos_cache=cos,
                                sin_cache=sin,
                                use_block_kv=True,
                            )
                        else:
                            q = NF.qkv_proj(hidden=x, cos_cache=cos, sin_cache=sin)
                        return q
            """,
        ),
        Example(
            title="a use of the norm the codemod cannot remove",
            before="""
                class Qwen3Attention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.q_norm = Qwen3RMSNorm(self.head_dim, config.rms_norm_eps, self.dtype)
                        self.k_norm = Qwen3RMSNorm(self.head_dim, config.rms_norm_eps, self.dtype)

                    def forward_prefill(self, q, k):
                        return self.q_norm(q) + self.k_norm(k)
            """,
            raises="other use of self.q_norm",
        ),
        Example(
            title="no attention class",
            before="""
                class LlamaMLP(nn.Module):
                    def forward(self, x):
                        return x
            """,
            raises="no attention class",
        ),
    )

    def transform_module(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        return _drop_mappings(self.remove_from_attention(module, ctx))

    def remove_from_attention(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        """Everything above except the ``load_weights`` entries (``qk-norm``
        keeps them when it puts full-width norms in place of per-head ones)."""
        classes = classes_with_role(module, "attention")
        if not classes:
            if any(class_role(name) == "attention" for name in ctx.port.package_classes):
                return module  # the attention is defined elsewhere; this file may map its norms
            raise ctx.precondition("remove-qk-norm: no attention class (<Prefix>Attention) in this file")
        for cls in classes:
            present = set(NORMS) & _assigned(cls)
            if len(present) == 1:
                raise ctx.precondition(
                    f"remove-qk-norm: {cls.name.value} has self.{present.pop()} but not its pair "
                    "(expected both self.q_norm and self.k_norm)",
                    cls,
                    module,
                )
        attention = [c for c in classes if _assigns_norms(c)]
        edits: dict = {}
        false = parse_expr("False", module)
        for cls in attention:
            handled: set[int] = set()
            for node in walk(cls):
                if isinstance(node, cst.SimpleStatementLine):
                    pair = self_assignment(node)
                    if pair is not None and pair[0] in NORMS:
                        edits[id(node)] = _remove
                        handled.update(id(n) for n in walk(node))
                        continue
                    assign = simple_assign(node)
                    if (
                        assign is not None
                        and isinstance(assign[1], cst.Call)
                        and self_attr(assign[1].func) in NORMS
                        or _attaches_norm_loader(node)
                    ):
                        edits[id(node)] = _remove
                        handled.update(id(n) for n in walk(node))
                elif isinstance(node, cst.Call) and projection_kind(node) is not None:
                    handled.update(id(n) for a in node.args for n in walk(a.value) if _reads_norm(a))
                    edits[id(node)] = lambda updated, false=false: _strip_call(updated, false)
            for node in walk(cls):
                if id(node) in handled:
                    continue
                if (
                    isinstance(node, cst.Attribute)
                    and node.attr.value in NORMS
                    and isinstance(node.value, cst.Name)
                    and node.value.value == "self"
                ):
                    raise ctx.precondition(
                        f"remove-qk-norm: {cls.name.value} has another use of self.{node.attr.value} that this "
                        "codemod cannot remove (other use of self.q_norm / self.k_norm)",
                        node,
                        module,
                    )
        return rewrite(module, edits)


def _assigned(cls: cst.ClassDef) -> set[str]:
    names = set()
    for node in walk(cls):
        if isinstance(node, cst.SimpleStatementLine):
            pair = self_assignment(node)
            if pair is not None:
                names.add(pair[0])
    return names


def _attaches_norm_loader(stmt: cst.SimpleStatementLine) -> bool:
    """``set_weight_loader(self.q_norm.weight, ...)`` (a loader another codemod
    put on the norm's gamma, such as a RoPE column reordering)."""
    if len(stmt.body) != 1 or not isinstance(stmt.body[0], cst.Expr):
        return False
    call = stmt.body[0].value
    if not isinstance(call, cst.Call) or not is_call(call, "set_weight_loader") or not call.args:
        return False
    target = call.args[0].value
    return (
        isinstance(target, cst.Attribute)
        and target.attr.value == "weight"
        and self_attr(target.value) in NORMS
    )


def _assigns_norms(cls: cst.ClassDef) -> bool:
    return set(NORMS) <= _assigned(cls)


def _reads_norm(arg: cst.Arg) -> bool:
    return arg.keyword is not None and arg.keyword.value in DECODE_NORM_ARGS + PREFILL_NORM_ARGS


def _strip_call(call: cst.Call, false: cst.BaseExpression) -> cst.Call:
    for name in DECODE_NORM_ARGS + PREFILL_NORM_ARGS:
        call = remove_keyword(call, name)
    for flag in DECODE_NORM_FLAGS:
        if keyword_arg(call, flag) is not None:
            call = set_keyword(call, flag, false)
    return call


def _remove(updated: cst.CSTNode) -> cst.RemovalSentinel:
    return cst.RemoveFromParent()


def _norm_entries(module: cst.Module):
    return [e for e in mapping_entries(module) if e.key.endswith((".q_norm.weight", ".k_norm.weight"))]


def _drop_mappings(module: cst.Module) -> cst.Module:
    entries = _norm_entries(module)
    return rewrite(module, {id(e.statement): (lambda updated: cst.RemoveFromParent()) for e in entries})
