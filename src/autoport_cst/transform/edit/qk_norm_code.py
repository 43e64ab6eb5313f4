"""The code qk-norm writes into an attention class: full-width query and
key norms (RMSNorm over all heads, sharded by head like the projection) with
their loaders and the methods computing them across TP ranks, the
arguments that turn on the kernels' own per-head pre-RoPE q/k norm (the
prefill ``NF.qkv_proj`` and the decode kernel), the method applying per-head
LayerNorms op by op, and the norms' ``load_weights`` entries."""

from __future__ import annotations

import libcst as cst

from autoport_cst.transform import FileContext
from autoport_cst.transform.anatomy.classes import is_parameter
from autoport_cst.transform.anatomy.mappings import entry_statement, mapping_entries
from autoport_cst.transform.anatomy.norm import norm_class
from autoport_cst.transform.anatomy.qkv import qkv_loader_arguments, self_attribute_behind
from autoport_cst.transform.cst.snippets import parse_expr
from autoport_cst.transform.cst.vocabulary import (
    code_of,
    dotted,
    self_assignment,
    statements,
    string_text,
    walk,
)
from autoport_cst.transform.edit.arguments import set_keyword
from autoport_cst.transform.edit.loaders import LoaderEdits
from autoport_cst.transform.edit.tree import insert_many_after, replace_string_suffix

NORM_NAMES = {"rmsnorm": "RMSNorm", "layernorm": "LayerNorm"}

# full-width norms, sharded by head like the projection (TP ranks; a KV head
# held by several ranks is loaded by each of them)
FULL_WIDTH_NORMS = """\
self.q_norm = {norm}(self.q_size, {eps}, {dtype})
self.k_norm = {norm}(self.kv_size, {eps}, {dtype})
set_weight_loader(
    self.q_norm.weight,
    sharding_weight_loader(shard_dim=0, shard_size=self.q_size, num_shards=self.world_size),
)
set_weight_loader(
    self.k_norm.weight,
    with_rank_override(
        sharding_weight_loader(
            shard_dim=0,
            shard_size=self.kv_size,
            num_shards=self.num_key_value_heads // self.num_key_value_heads_per_rank,
        ),
        self.rank // self.num_kv_replicas,
    ),
)
"""
# the attributes the full-width norms, their loaders and _full_width_rms_norm read
FULL_WIDTH_READS = (
    "q_size",
    "kv_size",
    "world_size",
    "rank",
    "num_key_value_heads",
    "num_key_value_heads_per_rank",
    "num_kv_replicas",
    "tp_group",
)
# the kernel's pre-RoPE q/k norm of NF.qkv_proj, per head
PREFILL_NORM_ARGS = (
    ("qk_norm_pre_rope_q_norm", "NormType.RMS_NORM"),
    ("qk_norm_pre_rope_k_norm", "NormType.RMS_NORM"),
    ("qk_norm_pre_rope_eps", "self.q_norm.{eps}"),
    ("qk_norm_pre_rope_q_gamma", "self.q_norm.weight.view(1, -1)"),
    ("qk_norm_pre_rope_k_gamma", "self.k_norm.weight.view(1, -1)"),
)

# the decode kernel's pre-RoPE q/k norm, per head
DECODE_NORM_ARGS = (
    ("rmsnorm_QK_pre_rope_enabled", "True"),
    ("rmsnorm_QK_pre_rope_eps", "self.q_norm.{eps}"),
    ("rmsnorm_QK_pre_rope_W_Q", "self.q_norm.weight.view(1, -1)"),
    ("rmsnorm_QK_pre_rope_W_K", "self.k_norm.weight.view(1, -1)"),
)

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


def has_post_rope_norm(call: cst.Call) -> bool:
    """Whether a kernel call already applies its per-head q/k norm after RoPE
    (``qk_norm_post_rope_*`` of ``NF.qkv_proj``, ``rmsnorm_QK_post_rope_enabled=True``
    of the decode kernel): the norms are there, at the position qk-norm-position chose."""
    for arg in call.args:
        if arg.keyword is None:
            continue
        name = arg.keyword.value
        if name.startswith("qk_norm_post_rope_"):
            return True
        if name == "rmsnorm_QK_post_rope_enabled":
            return isinstance(arg.value, cst.Name) and arg.value.value == "True"
    return False


def prefill_norm_args(call: cst.Call, eps_attr: str, module: cst.Module) -> cst.Call:
    """``NF.qkv_proj(...)`` with the kernel's per-head pre-RoPE q/k norm."""
    previous: tuple[str, ...] = ()
    for key, code in PREFILL_NORM_ARGS:
        call = set_keyword(call, key, parse_expr(code.format(eps=eps_attr), module), after=previous)
        previous = (key,)
    return call


def decode_norm_args(call: cst.Call, eps_attr: str, module: cst.Module) -> cst.Call:
    """The decode kernel call with its per-head pre-RoPE q/k norm on."""
    previous: tuple[str, ...] = ()
    for key, code in DECODE_NORM_ARGS:
        call = set_keyword(call, key, parse_expr(code.format(eps=eps_attr), module), after=previous)
        previous = (key,)
    return call


# per-head LayerNorms: no kernel normalises q/k heads with a mean and a bias
PER_HEAD_METHOD = '''
def _per_head_qk_norm(self, q, k):
    """The query and key norms of each head (q: [Nq, T, Dh], k: [Nkv, T, Dh]),
    op by op: the model's norm over the last dimension, its weight and bias
    of head_dim replicated on every rank."""
    return self.q_norm(q), self.k_norm(k)
'''


def norm_class_of_kind(module: cst.Module, ctx: FileContext, kind: str, width: str) -> cst.ClassDef:
    """The module's one norm class, which computes ``kind`` (``<Prefix>RMSNorm``
    or ``<Prefix>LayerNorm``); LayerNorm q/k norms per head only."""
    norm = norm_class(module)
    wanted = NORM_NAMES[kind]
    name = norm.name.value if norm is not None else ""
    if norm is None or not name.endswith(wanted) or (kind == "layernorm" and name.endswith("RMSNorm")):
        found = (
            ", ".join(
                c.name.value
                for c in module.body
                if isinstance(c, cst.ClassDef) and c.name.value.endswith("Norm")
            )
            or "none"
        )
        raise ctx.precondition(f"qk-norm: needs one {wanted} class (<Prefix>{wanted}), found {found}")
    if kind == "layernorm" and width != "per_head":
        raise ctx.precondition(
            "qk-norm: LayerNorm q/k norms over all heads (their mean and variance span the heads TP splits) "
            "are not implemented",
            norm,
            module,
        )
    return norm


def norm_mappings(
    module: cst.Module, ctx: FileContext, tensors: tuple[str, ...], required: bool = True
) -> cst.Module:
    """``...q_norm.<t>`` / ``...k_norm.<t>`` entries (``tensors``: weight, and
    bias) after each ``...self_attn.o_proj_weight`` one, their checkpoint keys
    derived from its checkpoint key (``...o_proj.weight``)."""
    entries = mapping_entries(module)
    keys = {e.key for e in entries}
    anchors = [e for e in entries if e.key.endswith(".self_attn.o_proj_weight")]
    if not anchors and required:
        raise ctx.precondition("qk-norm: load_weights has no mappings[...self_attn.o_proj_weight] entry")
    additions: dict[int, list[cst.BaseStatement]] = {}
    for entry in anchors:
        new: list[cst.BaseStatement] = []
        for which in ("q_norm", "k_norm"):
            for tensor in tensors:
                if entry.key[: -len("o_proj_weight")] + f"{which}.{tensor}" in keys:
                    continue
                key = replace_string_suffix(entry.key_node, "o_proj_weight", f"{which}.{tensor}")
                value = replace_string_suffix(
                    entry.value.with_changes(lpar=[], rpar=[]), "o_proj.weight", f"{which}.{tensor}"
                )
                if key is None or value is None:
                    raise ctx.precondition(
                        f"qk-norm: cannot derive the norms' checkpoint keys from the mapping of {entry.key} "
                        "(expected one checkpoint key ending in o_proj.weight)",
                        entry.statement,
                        module,
                    )
                new.append(
                    entry_statement(
                        entry, key, key.deep_clone() if string_text(value) == string_text(key) else value
                    )
                )
        if new:
            additions[id(entry.statement)] = new
    return insert_many_after(module, additions)


def norm_constructor_args(module: cst.Module, norm_name: str) -> tuple[cst.BaseExpression, ...] | None:
    """(eps, dtype) of the first ``<Norm>(size, eps, dtype)`` call outside the
    attention classes."""
    for node in walk(module):
        if isinstance(node, cst.Call) and dotted(node.func) == norm_name:
            args = node.args
            if len(args) == 3 and all(a.keyword is None for a in args):
                return args[1].value, args[2].value
    return None


def rebase(node: cst.BaseExpression, config: str) -> str:
    """``cfg.rms_norm_eps`` -> ``<config>.rms_norm_eps`` (other expressions as they are)."""
    text = dotted(node)
    if text is not None and text.count(".") == 1 and not text.startswith("self."):
        return f"{config}.{text.split('.', 1)[1]}"
    return code_of(node)


def last_parameter_statement(init: cst.FunctionDef) -> cst.BaseStatement | None:
    """The last ``self.<...>_weight`` / ``self.<...>_bias = nn.Parameter(...)`` of ``__init__``."""
    found = None
    for stmt in statements(init):
        pair = self_assignment(stmt)
        if pair is not None and is_parameter(pair[1]) and pair[0].endswith(("_weight", "_bias")):
            found = stmt
    return found


def attention_dp_guard(cls: cst.ClassDef, module: cst.Module, ctx: FileContext) -> tuple[str, str] | None:
    """``(statement, attribute)``: raise when attention data parallelism
    is on (the norm sums the squares over the TP ranks only), read from the
    ``attention_dp_size`` of the fused QKV weight's loader; None without it."""
    loaders = LoaderEdits(module, ctx, cls)
    for loader in loaders.of("qkv_proj_weight"):
        if loader.base is None:
            continue
        arguments, _ = qkv_loader_arguments(loader.base)
        if "attention_dp_size" not in arguments:
            continue
        attr = self_attribute_behind(loader, arguments["attention_dp_size"])
        if attr is None:
            raise ctx.precondition(
                f"qk-norm: cannot tell which attribute holds the attention data-parallel size "
                f"(attention_dp_size={arguments['attention_dp_size']} of the QKV weight's loader)",
                loader.base,
                module,
            )
        return (
            (
                f"if self.{attr} > 1:\n"
                '    raise NotImplementedError("q/k norms over all heads with attention data parallelism")\n'
            ),
            attr,
        )
    return None
