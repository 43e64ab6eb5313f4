"""qk-norm: RMSNorm of queries and keys before RoPE, per head (Qwen3) or over all heads (OLMo 2)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import libcst as cst

from autoport_cst.transform import Codemod, Example, FileContext, PortContext
from autoport_cst.transform.arguments import set_keyword
from autoport_cst.transform.attention import (
    DECODE_UNFUSED,
    UNFUSED_DECODE_CALL,
    add_functions,
    attention_classes,
    calls_in,
    eps_attribute,
    norm_class,
    norm_is_full_width,
    parse_method,
    statement_containing,
    to_unfused_decode,
)
from autoport_cst.transform.cst_helpers import (
    code_of,
    dotted,
    ensure_import_from,
    find_self_assignment,
    insert_many_after,
    is_call,
    parse_expr,
    parse_statements,
    positional_args,
    replace_string_suffix,
    rewrite,
    self_assignment,
    statements,
    walk,
    with_comment,
)
from autoport_cst.transform.layers import require_method
from autoport_cst.transform.mappings import entry_statement, mapping_entries

ID = "qk-norm"
ROPE_CALLS = ("apply_rotary_pos_emb",)
WEIGHT_LOADERS = "vllm_neuron.utils.weight_loader"

FULL_WIDTH_METHOD = '''
def _full_width_qk_norm(self, q, k):
    """RMSNorm over all query heads together, and over all key heads together
    (the norm spans the whole projection width, not one head).

    q: [Nq, T, Dh] and k: [Nkv, T, Dh] are this rank's heads; the mean square
    sums over the heads of every rank (a KV head held by several ranks is
    counted once), and each rank applies the weights of its own heads.
    """
    return (
        self._full_width_rms_norm(q, self.q_norm, 1),
        self._full_width_rms_norm(k, self.k_norm, self.num_kv_replicas),
    )
'''

FULL_WIDTH_NORM = '''
def _full_width_rms_norm(self, x, norm, replicas):
    """RMSNorm of x ([N, T, Dh], this rank's N heads) over the heads of all
    ranks, in float32; ``replicas`` ranks hold each of these heads."""
    dtype = x.dtype
    x = x.to(torch.float32)
    square_sum = x.pow(2).sum(dim=(0, 2), keepdim=True)  # [1, T, 1]
    width = x.shape[0] * x.shape[2]
    # >>> PARALLELISM: sum the squares of every rank's heads <<<
    if self.world_size > 1:
        square_sum = self.tp_group.all_reduce(square_sum) / replicas
        width = width * self.world_size // replicas
    x = x * torch.rsqrt(square_sum / width + norm.variance_epsilon)
    weight = norm.weight.to(torch.float32).view(x.shape[0], 1, x.shape[2])
    return (weight * x).to(dtype)
'''


@dataclass(frozen=True)
class QkNormParams:
    kind: Literal["per_head", "full_width"] = field(
        default="per_head",
        metadata={
            "doc": "per_head: one RMSNorm of head_dim shared by every head (Qwen3); full_width: "
            "RMSNorm over all query heads and over all key heads (OLMo 2)."
        },
    )


class QkNorm(Codemod):
    """RMSNorm of the queries and keys before RoPE.

    Model file, attention class (``<Prefix>Attention``), with the model's own
    RMSNorm class (``<Prefix>RMSNorm``, built like the decoder layer's norms,
    with the same epsilon and dtype):

    ``per_head`` (Qwen3): ``self.q_norm`` and ``self.k_norm`` of width
    ``head_dim``; prefill applies them to q ``[Nq, T, Dh]`` and k right
    before ``apply_rotary_pos_emb``; decode passes them to the kernel's
    pre-RoPE QK norm (``rmsnorm_QK_pre_rope_enabled=True``, its epsilon, and
    the gammas as ``[1, Dh]``). The weights are replicated on every rank.

    ``full_width`` (OLMo 2): the norms span all query heads (``Nq * Dh``) and
    all key heads; each rank holds the slice of the weights of its heads
    (sharded loaders), and ``_full_width_rms_norm`` sums the squares over the
    ranks (``tp_group.all_reduce``) before normalizing. Prefill applies it
    before RoPE. The fused decode kernel normalizes one head at a time only,
    so decode runs ``_attention_decode_unfused`` (added to the module): the
    kernel's work op by op (``NF.qkv_proj``, the norm, RoPE, the in-place
    cache write, attention over the paged context with the kernel's mask,
    ``NF.o_proj``), with the same arguments as the kernel call it replaces.

    ``load_weights`` maps ``...self_attn.q_norm.weight`` and
    ``...self_attn.k_norm.weight`` to the checkpoint keys of the same name.

    Preconditions: one RMSNorm class built somewhere as ``<Norm>(size, eps,
    dtype)``; the attention's ``forward_prefill`` rotates q and k with
    ``apply_rotary_pos_emb(q, k, ...)``; ``forward_decode`` calls
    ``NF.attention_decode``; a ``...self_attn.o_proj_weight`` mapping entry;
    per-head norms already in the attention are replaced (through
    ``remove-qk-norm``) when full-width ones are asked for; full-width norms
    are not turned into per-head ones.
    """

    ID = ID
    REALIZES = ("attention.qk_norm",)
    Params = QkNormParams
    AFTER = ("swap-norm", "add-qkv-bias", "unsqueeze-decode-biases")
    EXAMPLES = (
        Example(
            title="per-head norms (Qwen3)",
            params={"kind": "per_head"},
            before="""
                class Qwen3RMSNorm(nn.Module):
                    def __init__(self, hidden_size, eps, dtype):
                        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype))
                        self.variance_epsilon = eps


                class Qwen3Attention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, self.qkv_size))
                        self.o_proj_weight = nn.Parameter(torch.empty(self.q_size, self.hidden_size))

                    def forward_prefill(self, q, k, cos, sin):
                        q, k = apply_rotary_pos_emb(q, k, cos, sin)
                        return q, k

                    def forward_decode(self, x):
                        return NF.attention_decode(
                            X=x,
                            rmsnorm_QK_pre_rope_enabled=False,
                            rmsnorm_QK_post_rope_enabled=False,
                        )


                class Qwen3DecoderLayer(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.input_layernorm = Qwen3RMSNorm(config.hidden_size, config.rms_norm_eps, config.torch_dtype)


                class Qwen3ForCausalLM(nn.Module):
                    def load_weights(self, path):
                        for layer_id in range(2):
                            prefix = f"model.layers.{layer_id}"
                            mappings[f"{prefix}.self_attn.o_proj_weight"] = f"{prefix}.self_attn.o_proj.weight"
            """,
            after="""
                class Qwen3RMSNorm(nn.Module):
                    def __init__(self, hidden_size, eps, dtype):
                        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype))
                        self.variance_epsilon = eps


                class Qwen3Attention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, self.qkv_size))
                        self.o_proj_weight = nn.Parameter(torch.empty(self.q_size, self.hidden_size))
                        # <-- MODEL-SPECIFIC: RMSNorm of each query and key head before RoPE
                        self.q_norm = Qwen3RMSNorm(self.head_dim, config.rms_norm_eps, config.torch_dtype)
                        self.k_norm = Qwen3RMSNorm(self.head_dim, config.rms_norm_eps, config.torch_dtype)

                    def forward_prefill(self, q, k, cos, sin):
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


                class Qwen3DecoderLayer(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.input_layernorm = Qwen3RMSNorm(config.hidden_size, config.rms_norm_eps, config.torch_dtype)


                class Qwen3ForCausalLM(nn.Module):
                    def load_weights(self, path):
                        for layer_id in range(2):
                            prefix = f"model.layers.{layer_id}"
                            mappings[f"{prefix}.self_attn.o_proj_weight"] = f"{prefix}.self_attn.o_proj.weight"
                            mappings[f"{prefix}.self_attn.q_norm.weight"] = f"{prefix}.self_attn.q_norm.weight"
                            mappings[f"{prefix}.self_attn.k_norm.weight"] = f"{prefix}.self_attn.k_norm.weight"
            """,
        ),
        Example(
            title="the norm must be an RMSNorm",
            params={"kind": "per_head"},
            before="""
                class StableLmLayerNorm(nn.Module):
                    def __init__(self, hidden_size, eps, dtype):
                        self.variance_epsilon = eps


                class StableLmAttention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, self.qkv_size))
            """,
            raises="qk-norm: needs one RMSNorm class (<Prefix>RMSNorm), found StableLmLayerNorm",
        ),
    )

    @classmethod
    def realizes(cls, diff) -> bool:
        # adds norms to a reference without them, or replaces per-head norms
        # with full-width ones (remove-qk-norm first); not the other way
        return diff.path in cls.REALIZES and (
            (diff.reference == "none" and diff.target != "none")
            or (diff.reference == "per_head" and diff.target == "full_width")
        )

    @classmethod
    def params_for(cls, diffs, target, port: PortContext) -> QkNormParams:
        return QkNormParams(kind=target.attention.qk_norm)

    def transform_module(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        norm = norm_class(module)
        if norm is None or not norm.name.value.endswith("RMSNorm"):
            found = ", ".join(
                c.name.value for c in module.body
                if isinstance(c, cst.ClassDef) and c.name.value.endswith(("Norm",))
            ) or "none"
            raise ctx.precondition(f"{ID}: needs one RMSNorm class (<Prefix>RMSNorm), found {found}")
        attention = attention_classes(module, ctx, ID)
        eps_attr = eps_attribute(norm)
        if eps_attr is None:
            raise ctx.precondition(
                f"{ID}: {norm.name.value}.__init__ stores no epsilon (self.<...eps...> = eps)", norm, module
            )
        ctor_args = _norm_constructor_args(module, norm.name.value)
        if ctor_args is None:
            raise ctx.precondition(
                f"{ID}: {norm.name.value} is never built as {norm.name.value}(size, eps, dtype) "
                "in this file; cannot tell which epsilon and dtype the query and key norms take",
                norm,
                module,
            )
        full = self.params.kind == "full_width"
        if full and any(
            find_self_assignment(require_method(c, "__init__", ctx, module, ID), "q_norm") is not None
            and not norm_is_full_width(c, "q_norm")
            for c in attention
        ):
            # per-head norms (a qwen3 / qwen3_moe reference) make way for full-width ones
            from autoport_cst.transform.library import get_codemod

            remove = get_codemod("remove-qk-norm")
            module = remove(remove.parse_params({})).remove_from_attention(module, ctx)
            attention = attention_classes(module, ctx, ID)
        edits: dict = {}
        for cls in attention:
            self._attention_edits(cls, norm.name.value, eps_attr, ctor_args, module, ctx, edits)
        module = rewrite(module, edits)
        module = self._mappings(module, ctx)
        if full:
            module = add_functions(module, [DECODE_UNFUSED])
            module = ensure_import_from(module, WEIGHT_LOADERS, "with_rank_override")
            module = ensure_import_from(module, WEIGHT_LOADERS, "sharding_weight_loader")
            module = ensure_import_from(module, WEIGHT_LOADERS, "set_weight_loader")
        return module

    # -- attention class -----------------------------------------------------------

    def _attention_edits(self, cls, norm_name, eps_attr, ctor_args, module, ctx, edits) -> None:
        name = cls.name.value
        init = require_method(cls, "__init__", ctx, module, ID)
        prefill = require_method(cls, "forward_prefill", ctx, module, ID)
        decode = require_method(cls, "forward_decode", ctx, module, ID)
        init_params = [p.name.value for p in init.params.params]
        config = init_params[1] if len(init_params) > 1 else "config"
        full = self.params.kind == "full_width"

        existing = find_self_assignment(init, "q_norm")
        if existing is not None and full != norm_is_full_width(cls, "q_norm"):
            have = "full-width" if not full else "per-head"
            raise ctx.precondition(
                f"{ID}: {name} already has {have} q/k norms; turning them into "
                f"{self.params.kind.replace('_', '-')} ones is not supported (port from a reference "
                "without q/k norms)",
                existing,
                module,
            )
        # __init__: the norms
        if existing is None:
            anchor = _last_parameter_statement(init)
            if anchor is None:
                raise ctx.precondition(
                    f"{ID}: {name}.__init__ creates no nn.Parameter to place the norms after", init, module
                )
            eps, dtype = (_rebase(a, config) for a in ctor_args)
            if full:
                code = (
                    f"self.q_norm = {norm_name}(self.q_size, {eps}, {dtype})\n"
                    f"self.k_norm = {norm_name}(self.kv_size, {eps}, {dtype})\n"
                    "set_weight_loader(\n"
                    "    self.q_norm.weight,\n"
                    "    sharding_weight_loader(shard_dim=0, shard_size=self.q_size, num_shards=self.world_size),\n"
                    ")\n"
                    "set_weight_loader(\n"
                    "    self.k_norm.weight,\n"
                    "    with_rank_override(\n"
                    "        sharding_weight_loader(\n"
                    "            shard_dim=0,\n"
                    "            shard_size=self.kv_size,\n"
                    "            num_shards=self.num_key_value_heads // self.num_key_value_heads_per_rank,\n"
                    "        ),\n"
                    "        self.rank // self.num_kv_replicas,\n"
                    "    ),\n"
                    ")\n"
                )
                comment = "<-- MODEL-SPECIFIC: RMSNorm over all query / all key heads before RoPE, sharded by head"
            else:
                code = (
                    f"self.q_norm = {norm_name}(self.head_dim, {eps}, {dtype})\n"
                    f"self.k_norm = {norm_name}(self.head_dim, {eps}, {dtype})\n"
                )
                comment = "<-- MODEL-SPECIFIC: RMSNorm of each query and key head before RoPE"
            new = parse_statements(code, module)
            new[0] = with_comment(new[0], comment)
            edits[id(anchor)] = lambda updated, new=new: cst.FlattenSentinel([updated, *new])

        # prefill: the norms before RoPE
        if not any(
            isinstance(n, cst.Call) and dotted(n.func) in ("self.q_norm", "self._full_width_qk_norm")
            for n in walk(prefill)
        ):
            rope = [n for n in walk(prefill) if isinstance(n, cst.Call) and is_call(n, *ROPE_CALLS)]
            if len(rope) != 1:
                raise ctx.precondition(
                    f"{ID}: expected one apply_rotary_pos_emb(q, k, ...) call in {name}.forward_prefill, "
                    f"found {len(rope)}",
                    prefill,
                    module,
                )
            args = positional_args(rope[0])
            if len(args) < 2 or not all(isinstance(a.value, cst.Name) for a in args[:2]):
                raise ctx.precondition(
                    f"{ID}: apply_rotary_pos_emb in {name}.forward_prefill must take q and k as names",
                    rope[0],
                    module,
                )
            q, k = args[0].value.value, args[1].value.value
            holder = statement_containing(prefill, rope[0])
            if full:
                code = f"{q}, {k} = self._full_width_qk_norm({q}, {k})\n"
            else:
                code = f"{q} = self.q_norm({q})\n{k} = self.k_norm({k})\n"
            new = parse_statements(code, module)
            new[0] = with_comment(new[0], "<-- MODEL-SPECIFIC: query and key norms before RoPE")

            def place(updated, new=new):
                first = new[0].with_changes(leading_lines=[*updated.leading_lines, *new[0].leading_lines])
                return cst.FlattenSentinel([first, *new[1:], updated.with_changes(leading_lines=[])])

            edits[id(holder)] = place

        # decode
        kernel = calls_in(decode, "NF.attention_decode")
        unfused = calls_in(decode, UNFUSED_DECODE_CALL)
        if not kernel and not unfused:
            raise ctx.precondition(
                f"{ID}: no NF.attention_decode(...) call in {name}.forward_decode", decode, module
            )
        if full:
            for call in kernel + unfused:
                edits[id(call)] = lambda updated: set_keyword(
                    to_unfused_decode(updated), "qk_norm", parse_expr("self._full_width_qk_norm", module)
                )
            if all(s.name.value != "_full_width_qk_norm" for s in cls.body.body if isinstance(s, cst.FunctionDef)):
                methods = [parse_method(FULL_WIDTH_METHOD, module),
                           parse_method(FULL_WIDTH_NORM, module)]
                methods = [m.with_changes(leading_lines=[cst.EmptyLine(indent=False)]) for m in methods]
                edits[id(decode)] = lambda updated, methods=methods: cst.FlattenSentinel([updated, *methods])
        else:
            values = {
                "rmsnorm_QK_pre_rope_enabled": "True",
                "rmsnorm_QK_pre_rope_eps": f"self.q_norm.{eps_attr}",
                "rmsnorm_QK_pre_rope_W_Q": "self.q_norm.weight.view(1, -1)",
                "rmsnorm_QK_pre_rope_W_K": "self.k_norm.weight.view(1, -1)",
            }

            def decode_args(updated):
                previous = ()
                for key, code in values.items():
                    updated = set_keyword(updated, key, parse_expr(code, module), after=previous)
                    previous = (key,)
                return updated

            for call in kernel + unfused:
                edits[id(call)] = decode_args

    # -- load_weights ------------------------------------------------------------------

    def _mappings(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        entries = mapping_entries(module)
        keys = {e.key for e in entries}
        anchors = [e for e in entries if e.key.endswith(".self_attn.o_proj_weight")]
        if not anchors:
            raise ctx.precondition(f"{ID}: load_weights has no mappings[...self_attn.o_proj_weight] entry")
        additions: dict[int, list[cst.BaseStatement]] = {}
        for entry in anchors:
            new = []
            for which in ("q_norm", "k_norm"):
                key_text = entry.key[: -len("o_proj_weight")] + f"{which}.weight"
                if key_text in keys:
                    continue
                key = replace_string_suffix(entry.key_node, "o_proj_weight", f"{which}.weight")
                value = replace_string_suffix(entry.key_node, "o_proj_weight", f"{which}.weight")
                new.append(entry_statement(entry, key, value))
            if new:
                additions[id(entry.statement)] = new
        return insert_many_after(module, additions)


def _norm_constructor_args(module: cst.Module, norm_name: str) -> tuple[cst.BaseExpression, ...] | None:
    """(eps, dtype) of the first ``<Norm>(size, eps, dtype)`` call outside the
    attention classes."""
    for node in walk(module):
        if isinstance(node, cst.Call) and dotted(node.func) == norm_name:
            args = node.args
            if len(args) == 3 and all(a.keyword is None for a in args):
                return args[1].value, args[2].value
    return None


def _rebase(node: cst.BaseExpression, config: str) -> str:
    """``cfg.rms_norm_eps`` -> ``<config>.rms_norm_eps`` (other expressions as they are)."""
    text = dotted(node)
    if text is not None and text.count(".") == 1 and not text.startswith("self."):
        return f"{config}.{text.split('.', 1)[1]}"
    return code_of(node)


def _last_parameter_statement(init: cst.FunctionDef) -> cst.BaseStatement | None:
    from autoport_cst.transform.layers import is_parameter

    found = None
    for stmt in statements(init):
        pair = self_assignment(stmt)
        if pair is not None and is_parameter(pair[1]) and pair[0].endswith(("_weight", "_bias")):
            found = stmt
    return found



