"""qk-norm-position: per-head q/k norms applied to the rotated queries and keys (after RoPE)."""

from __future__ import annotations

import libcst as cst

from autoport_cst.spec.pitfalls import Pitfall
from autoport_cst.transform import Codemod, Example, FileContext, NoParams
from autoport_cst.transform.anatomy.attention import UNFUSED_DECODE_CALL, attention_classes
from autoport_cst.transform.anatomy.qkv import forward_methods, projections
from autoport_cst.transform.cst.snippets import parse_expr
from autoport_cst.transform.cst.vocabulary import (
    dotted,
    free_names,
    is_call,
    keyword_arg,
    simple_assign,
    statements,
    walk,
)
from autoport_cst.transform.edit.arguments import set_keyword
from autoport_cst.transform.edit.tree import rewrite, with_comment
from autoport_cst.transform.realizes import Realizes, from_to

ID = "qk-norm-position"
ROPE_CALLS = ("apply_rotary_pos_emb",)
NORMS = ("self.q_norm", "self.k_norm")
# the decode kernel's q/k norm arguments: pre-RoPE name -> post-RoPE name
DECODE_ARGS = {
    "rmsnorm_QK_pre_rope_eps": "rmsnorm_QK_post_rope_eps",
    "rmsnorm_QK_pre_rope_W_Q": "rmsnorm_QK_post_rope_W_Q",
    "rmsnorm_QK_pre_rope_W_K": "rmsnorm_QK_post_rope_W_K",
}
COMMENT = "<-- MODEL-SPECIFIC: query and key norms after RoPE (on the rotated heads)"


class QkNormPosition(Codemod):
    """Apply the per-head q/k RMSNorms to the rotated queries and keys (after RoPE; HunYuan) instead
    of to the projections (before RoPE; Qwen3).

    Model file, attention class (``<Prefix>Attention``) with per-head norms
    ``self.q_norm`` / ``self.k_norm`` (a ``qwen3``-family reference, or after
    ``qk-norm``):

    - prefill, explicit RoPE: the two statements ``q = self.q_norm(q)`` and
      ``k = self.k_norm(k)`` move from right before the statement that
      rotates q and k (``q, k = apply_rotary_pos_emb(q, k, ...)``) to right
      after it, in every forward method that has them;
    - prefill, RoPE fused into ``NF.qkv_proj``: each call fusing the norms
      before RoPE (``qk_norm_pre_rope_*``) fuses them after it instead (the
      same arguments named ``qk_norm_post_rope_*``);
    - decode: every decode kernel call switches from the kernel's pre-RoPE
      q/k norm to its post-RoPE one: ``rmsnorm_QK_pre_rope_enabled=False``,
      ``rmsnorm_QK_post_rope_enabled=True``, and the epsilon and gamma
      arguments take their ``post_rope`` names with the same values.

    The norm modules, their weights and the ``load_weights`` entries do not
    change.

    Preconditions: explicit norms are applied by those two consecutive
    statements, followed by the statement rotating the same names, and
    nothing in between reads or writes those names; a projection fusing the
    norms fuses RoPE too; every decode kernel call has
    ``rmsnorm_QK_pre_rope_enabled=True``. Full-width q/k norms (decode through
    ``_attention_decode_unfused``) are refused with their position.
    """

    ID = ID
    REALIZES = Realizes({"attention.qk_norm_position": from_to("before_rope", "after_rope")})
    Params = NoParams
    NEEDS_REAL_MODEL = True
    PITFALLS = (
        Pitfall(
            60,
            lambda spec, facts: (
                spec.attention.qk_norm == "per_head" and spec.attention.qk_norm_position == "after_rope"
            ),
            "per-head q/k norm after RoPE: the decode kernel's post-RoPE norm (rmsnorm_QK_post_rope_*), "
            "and in prefill the norm on the rotated heads; a pre-RoPE norm is silently wrong",
        ),
    )
    AFTER = ("qk-norm",)
    EXAMPLES = (
        Example(
            title="Qwen3-style norms move after RoPE",
            before="""
                class Qwen3Attention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, self.qkv_size))
                        self.q_norm = Qwen3RMSNorm(self.head_dim, config.rms_norm_eps, config.torch_dtype)
                        self.k_norm = Qwen3RMSNorm(self.head_dim, config.rms_norm_eps, config.torch_dtype)

                    def forward_prefill(self, q, k, position_embeddings):
                        cos, sin = position_embeddings
                        # <-- MODEL-SPECIFIC: query and key norms before RoPE
                        q = self.q_norm(q)
                        k = self.k_norm(k)
                        q, k = apply_rotary_pos_emb(q, k, cos, sin)
                        return q, k

                    def forward_decode(self, x):
                        return NF.attention_decode(
                            X=x,
                            rmsnorm_QK_pre_rope_enabled=True,
                            rmsnorm_QK_pre_rope_eps=self.q_norm.variance_epsilon,
                            rmsnorm_QK_pre_rope_W_Q=self.q_norm.weight.view(1, -1),
                            rmsnorm_QK_pre_rope_W_K=self.k_norm.weight.view(1, -1),
                            rmsnorm_QK_post_rope_enabled=False,
                        )
            """,
            after="""
                class Qwen3Attention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, self.qkv_size))
                        self.q_norm = Qwen3RMSNorm(self.head_dim, config.rms_norm_eps, config.torch_dtype)
                        self.k_norm = Qwen3RMSNorm(self.head_dim, config.rms_norm_eps, config.torch_dtype)

                    def forward_prefill(self, q, k, position_embeddings):
                        cos, sin = position_embeddings
                        q, k = apply_rotary_pos_emb(q, k, cos, sin)
                        # <-- MODEL-SPECIFIC: query and key norms after RoPE (on the rotated heads)
                        q = self.q_norm(q)
                        k = self.k_norm(k)
                        return q, k

                    def forward_decode(self, x):
                        return NF.attention_decode(
                            X=x,
                            rmsnorm_QK_pre_rope_enabled=False,
                            rmsnorm_QK_post_rope_eps=self.q_norm.variance_epsilon,
                            rmsnorm_QK_post_rope_W_Q=self.q_norm.weight.view(1, -1),
                            rmsnorm_QK_post_rope_W_K=self.k_norm.weight.view(1, -1),
                            rmsnorm_QK_post_rope_enabled=True,
                        )
            """,
        ),
        Example(
            title="norms fused into a projection that fuses RoPE (real vllm_neuron llama3 shape)",
            before="""
                class Qwen3Attention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, self.qkv_size))

                    def forward_prefill(self, x, cos, sin):
                        return NF.qkv_proj(
                            hidden=x,
                            qkv_weights=self.qkv_proj_weight,
                            cos_cache=cos,
                            sin_cache=sin,
                            qk_norm_pre_rope_q_norm=NormType.RMS_NORM,
                            qk_norm_pre_rope_k_norm=NormType.RMS_NORM,
                            qk_norm_pre_rope_eps=self.q_norm.variance_epsilon,
                            qk_norm_pre_rope_q_gamma=self.q_norm.weight.view(1, -1),
                            qk_norm_pre_rope_k_gamma=self.k_norm.weight.view(1, -1),
                        )

                    def forward_decode(self, x):
                        return NF.attention_decode(X=x, rmsnorm_QK_pre_rope_enabled=True, rmsnorm_QK_pre_rope_eps=1e-6)
            """,
            after="""
                class Qwen3Attention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, self.qkv_size))

                    def forward_prefill(self, x, cos, sin):
                        return NF.qkv_proj(
                            hidden=x,
                            qkv_weights=self.qkv_proj_weight,
                            cos_cache=cos,
                            sin_cache=sin,
                            qk_norm_post_rope_q_norm=NormType.RMS_NORM,
                            qk_norm_post_rope_k_norm=NormType.RMS_NORM,
                            qk_norm_post_rope_eps=self.q_norm.variance_epsilon,
                            qk_norm_post_rope_q_gamma=self.q_norm.weight.view(1, -1),
                            qk_norm_post_rope_k_gamma=self.k_norm.weight.view(1, -1),
                        )

                    def forward_decode(self, x):
                        return NF.attention_decode(X=x, rmsnorm_QK_pre_rope_enabled=False, rmsnorm_QK_post_rope_eps=1e-6, rmsnorm_QK_post_rope_enabled=True)
            """,
        ),
        Example(
            title="something between the norms and the rotation",
            before="""
                class Qwen3Attention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, self.qkv_size))

                    def forward_prefill(self, q, k, cos, sin):
                        q = self.q_norm(q)
                        k = self.k_norm(k)
                        q = q * self.scale
                        q, k = apply_rotary_pos_emb(q, k, cos, sin)
                        return q, k

                    def forward_decode(self, x):
                        return NF.attention_decode(X=x, rmsnorm_QK_pre_rope_enabled=True)
            """,
            raises="uses q between the q/k norms and the statement rotating q and k",
        ),
        Example(
            title="full-width norms are not moved",
            before="""
                class Olmo2Attention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, self.qkv_size))

                    def forward_prefill(self, q, k, cos, sin):
                        q, k = self._full_width_qk_norm(q, k)
                        q, k = apply_rotary_pos_emb(q, k, cos, sin)
                        return q, k

                    def forward_decode(self, x):
                        return _attention_decode_unfused(X=x, qk_norm=self._full_width_qk_norm)
            """,
            raises="full-width q/k norms after RoPE are not supported",
        ),
    )

    def transform_module(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        edits: dict = {}
        for cls in attention_classes(module, ctx):
            self._prefill_edits(cls, module, ctx, edits)
            self._decode_edits(cls, module, ctx, edits)
        return rewrite(module, edits)

    # -- prefill -------------------------------------------------------------------

    def _prefill_edits(self, cls: cst.ClassDef, module: cst.Module, ctx: FileContext, edits: dict) -> None:
        name = cls.name.value
        for node in walk(cls):
            if isinstance(node, cst.Call) and dotted(node.func) == "self._full_width_qk_norm":
                raise ctx.precondition(
                    f"{ID}: {name} has full-width q/k norms; full-width q/k norms after RoPE are not "
                    "supported (the decode kernel normalizes one head at a time)",
                    node,
                    module,
                )
        fused = [p for p in projections(cls) if p.kind == "prefill" and _fused_norm(p.call) is not None]
        for projection in fused:
            if _fused_norm(projection.call) == "post":
                continue
            if not projection.fused_rope:
                raise ctx.precondition(
                    f"{ID}: this NF.qkv_proj call in {name}.{projection.method.name.value} fuses the q/k norm "
                    "but not RoPE (no cos_cache/sin_cache); its queries and keys are rotated elsewhere",
                    projection.call,
                    module,
                )
            edits[id(projection.call)] = _post_rope_projection
        explicit = [
            m for m in forward_methods(cls) if any(_norm_target(s) is not None for s in statements(m))
        ]
        for method_node in explicit:
            self._move_statements(cls, method_node, module, ctx, edits)
        if not fused and not explicit:
            raise ctx.precondition(
                f"{ID}: expected the two statements q = self.q_norm(q) and k = self.k_norm(k), one after "
                f"the other, in a forward method of {name}, or NF.qkv_proj calls fusing the norms "
                "(qk_norm_pre_rope_*); found neither",
                cls,
                module,
            )

    def _move_statements(self, cls, prefill, module, ctx, edits) -> None:
        name = f"{cls.name.value}.{prefill.name.value}"
        body = list(statements(prefill))
        norms = [i for i, stmt in enumerate(body) if _norm_target(stmt) is not None]
        if len(norms) != 2 or norms[1] != norms[0] + 1:
            raise ctx.precondition(
                f"{ID}: expected the two statements q = self.q_norm(q) and k = self.k_norm(k), one after "
                f"the other, in {name}; found {len(norms)}",
                prefill,
                module,
            )
        first, second = body[norms[0]], body[norms[1]]
        before = body[norms[0] - 1] if norms[0] > 0 else None
        if before is not None and _rotates(before, _norm_targets(first, second)):
            return  # already after RoPE
        targets = _norm_targets(first, second)
        later = body[norms[1] + 1 :]
        index = next((i for i, stmt in enumerate(later) if _rotates(stmt, targets)), None)
        if index is None:
            raise ctx.precondition(
                f"{ID}: no statement rotating {' and '.join(sorted(targets))} "
                "(q, k = apply_rotary_pos_emb(q, k, ...)) after the q/k norms in "
                f"{name}",
                second,
                module,
            )
        rotation = later[index]
        for stmt in later[:index]:
            used = sorted(targets & free_names(stmt))
            if used:
                raise ctx.precondition(
                    f"{ID}: {name} uses {', '.join(used)} between the q/k norms and the "
                    "statement rotating q and k; the norms cannot move past it",
                    stmt,
                    module,
                )
        kept = [line for line in first.leading_lines if not _is_before_rope_comment(line)]
        moved = [
            with_comment(first.with_changes(leading_lines=[]), COMMENT),
            second.with_changes(leading_lines=[]),
        ]
        edits[id(first)] = lambda updated: cst.RemoveFromParent()
        edits[id(second)] = lambda updated: cst.RemoveFromParent()
        edits[id(rotation)] = lambda updated, kept=kept, moved=moved: cst.FlattenSentinel(
            [updated.with_changes(leading_lines=[*kept, *updated.leading_lines]), *moved]
        )

    # -- decode ----------------------------------------------------------------------

    def _decode_edits(self, cls: cst.ClassDef, module: cst.Module, ctx: FileContext, edits: dict) -> None:
        name = cls.name.value
        kernels = [p for p in projections(cls) if p.kind == "decode"]
        unfused = [p for p in kernels if dotted(p.call.func) == UNFUSED_DECODE_CALL]
        if unfused and keyword_arg(unfused[0].call, "qk_norm") is not None:
            raise ctx.precondition(
                f"{ID}: {name}.{unfused[0].method.name.value} runs the unfused decode with full-width q/k "
                "norms; full-width q/k norms after RoPE are not supported",
                unfused[0].call,
                module,
            )
        if not kernels:
            raise ctx.precondition(f"{ID}: no NF.attention_decode(...) call in {name}", cls, module)
        for projection in kernels:
            call = projection.call
            if _keyword_is(call, "rmsnorm_QK_post_rope_enabled", "True"):
                continue  # already after RoPE
            if not _keyword_is(call, "rmsnorm_QK_pre_rope_enabled", "True"):
                raise ctx.precondition(
                    f"{ID}: {name}.{projection.method.name.value} calls {dotted(call.func)} without "
                    "rmsnorm_QK_pre_rope_enabled=True: no q/k norm to move",
                    call,
                    module,
                )
            edits[id(call)] = lambda updated: _post_rope_call(updated, module)


def _norm_target(stmt: cst.BaseStatement) -> str | None:
    """``q`` for ``q = self.q_norm(q)`` (the same name on both sides)."""
    assign = simple_assign(stmt)
    if assign is None:
        return None
    target, value = assign
    if not (isinstance(target, cst.Name) and isinstance(value, cst.Call) and dotted(value.func) in NORMS):
        return None
    args = value.args
    if len(args) != 1 or not isinstance(args[0].value, cst.Name) or args[0].value.value != target.value:
        return None
    return target.value


def _norm_targets(*stmts: cst.BaseStatement) -> set[str]:
    return {name for name in (_norm_target(s) for s in stmts) if name is not None}


def _rotates(stmt: cst.BaseStatement, names: set[str]) -> bool:
    """Whether ``stmt`` is ``a, b = apply_rotary_pos_emb(...)`` assigning ``names``."""
    assign = simple_assign(stmt)
    if assign is None:
        return False
    target, value = assign
    if not (isinstance(value, cst.Call) and is_call(value, *ROPE_CALLS) and isinstance(target, cst.Tuple)):
        return False
    assigned = {e.value.value for e in target.elements if isinstance(e.value, cst.Name)}
    return names <= assigned


def _is_before_rope_comment(line: cst.EmptyLine) -> bool:
    return line.comment is not None and "before RoPE" in line.comment.value


def _keyword_is(call: cst.Call, name: str, value: str) -> bool:
    arg = keyword_arg(call, name)
    return arg is not None and isinstance(arg.value, cst.Name) and arg.value.value == value


def _post_rope_call(call: cst.Call, module: cst.Module) -> cst.Call:
    args = []
    for arg in call.args:
        keyword = arg.keyword.value if arg.keyword is not None else None
        if keyword == "rmsnorm_QK_pre_rope_enabled":
            arg = arg.with_changes(value=parse_expr("False", module))
        elif keyword == "rmsnorm_QK_post_rope_enabled":
            arg = arg.with_changes(value=parse_expr("True", module))
        elif keyword in DECODE_ARGS:
            arg = arg.with_changes(keyword=cst.Name(DECODE_ARGS[keyword]))
        args.append(arg)
    call = call.with_changes(args=args)
    if keyword_arg(call, "rmsnorm_QK_post_rope_enabled") is None:
        call = set_keyword(call, "rmsnorm_QK_post_rope_enabled", parse_expr("True", module))
    return call


PROJECTION_NORM_ARGS = ("q_norm", "k_norm", "eps", "q_gamma", "k_gamma", "q_beta", "k_beta")


def _fused_norm(call: cst.Call) -> str | None:
    """``pre`` or ``post``: where an ``NF.qkv_proj`` call fuses its q/k norm
    (None: it fuses none)."""
    for stage in ("post", "pre"):
        if any(keyword_arg(call, f"qk_norm_{stage}_rope_{a}") is not None for a in PROJECTION_NORM_ARGS):
            return stage
    return None


def _post_rope_projection(call: cst.Call) -> cst.Call:
    """The projection's fused q/k norm moved after its fused RoPE: the
    ``qk_norm_pre_rope_*`` arguments take their ``qk_norm_post_rope_*`` names."""
    renamed = {f"qk_norm_pre_rope_{a}": f"qk_norm_post_rope_{a}" for a in PROJECTION_NORM_ARGS}
    args = [
        a.with_changes(keyword=cst.Name(renamed[a.keyword.value]))
        if a.keyword is not None and a.keyword.value in renamed
        else a
        for a in call.args
    ]
    return call.with_changes(args=args)
