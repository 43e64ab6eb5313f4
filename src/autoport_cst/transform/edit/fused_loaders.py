"""The loaders that read Q/K/V and gate/up from one fused checkpoint
tensor (their code, written into a model file), and the CST edits that
attach them, rewrite their mapping keys and add their functions; used by the
fused-checkpoint codemod."""

from __future__ import annotations

import re

import libcst as cst

from autoport_cst.transform.cst.snippets import parse_expr, parse_statement
from autoport_cst.transform.edit.arguments import set_keyword

QKV_LOADERS = ("fused_qkv_weight_loader", "fused_qkv_bias_loader")
QKV_SPLIT = "fused_qkv_split_loader"
PART = "fused_part_loader"
QKV_KWARGS = (
    "q_size",
    "kv_size",
    "num_shards",
    "num_kv_replicas",
    "is_storage_transposed",
    "attention_dp_rank",
    "attention_dp_size",
    "kv_sharded_across_attention_dp",
)
PART_KWARGS = ("shard_size", "num_shards", "is_storage_transposed")

QKV_SPLIT_CODE = f'''
def {QKV_SPLIT}(
    q_size,
    kv_size,
    num_shards,
    num_kv_replicas=1,
    is_storage_transposed=False,
    per_head=False,
    head_dim=None,
    groups=None,
    order="qkv",
    kv_groups=False,
    attention_dp_rank=0,
    attention_dp_size=1,
    kv_sharded_across_attention_dp=False,
):
    """Loader for this rank's [q | k | v] slice of one checkpoint tensor that
    fuses Q, K and V on its first dimension.

    Concatenated layout (Phi-3 qkv_proj): every query row, then every key row, then
    every value row. Per-head layout (GPT-NeoX query_key_value, per_head=True):
    head by head, that head's query, key and value rows (head_dim each); it
    needs as many key/value heads as query heads. With groups, the rows come
    in that many equal groups instead of one per head, each its share of the
    query, key and value rows in the order ``order`` (CodeGen: 4 groups of
    [q v k]). With kv_groups (and per_head), one group per KV head: its
    query heads, then its key head, then its value head (Falcon-40B's new
    decoder architecture; GPT-NeoX's layout when there are as many KV heads
    as query heads). Each rank takes its query
    heads and the key/value heads it holds (ranks share a KV head when there
    are fewer KV heads than ranks). With attention data parallelism the query
    heads are sharded over num_shards x attention_dp_size ranks (this rank's:
    attention_dp_rank + rank x attention_dp_size), the key/value heads too
    with kv_sharded_across_attention_dp. Weights come out transposed to
    [hidden, q | k | v] with is_storage_transposed; a weight stored [in, out]
    already (GPT-2's Conv1D c_attn, not is_storage_transposed) fuses on its
    last dimension and keeps its layout; biases stay 1-D.
    """

    def transform(slices, rank):
        if len(slices) != 1:
            raise ValueError(f"{QKV_SPLIT} takes one fused tensor, got {{len(slices)}}")
        fused = slices[0]
        in_out = not is_storage_transposed and len(fused.get_shape()) == 2
        rows = fused.get_shape()[-1 if in_out else 0]

        def take(start, stop):
            """Rows start..stop of the fused dimension, as rows."""
            return fused[:, start:stop].T if in_out else fused[start:stop]
        tp_rank = rank % num_shards
        q_rank = attention_dp_rank + tp_rank * attention_dp_size
        kv_rank = q_rank if kv_sharded_across_attention_dp else tp_rank // num_kv_replicas
        q_total = q_size * num_shards * attention_dp_size
        if per_head:
            if kv_groups:
                kv_heads = (rows - q_total) // (2 * head_dim)
                widths = dict(q=q_total // kv_heads, k=head_dim, v=head_dim)
                roles = "qkv"
                if rows != q_total + 2 * kv_heads * head_dim or q_total % (kv_heads * head_dim):
                    raise ValueError(f"{{rows}} fused rows are no groups of query heads, a key and a value head")
            else:
                group = rows // (3 * groups) if groups else head_dim
                if rows % (3 * group) != 0 or num_kv_replicas != 1:
                    raise ValueError("a per-head fused QKV tensor needs as many KV heads as query heads")
                widths, roles = dict.fromkeys("qkv", group), order
            stride = sum(widths.values())

            def heads(first, size, role):
                """Rows first..first + size of one part, gathered from their groups."""
                wanted = torch.arange(first, first + size)
                offset = sum(widths[r] for r in roles[: roles.index(role)])
                stored = wanted // widths[role] * stride + offset + wanted % widths[role]
                low = int(stored.min())
                return take(low, int(stored.max()) + 1)[stored - low]

            parts = [
                heads(q_rank * q_size, q_size, "q"),
                heads(kv_rank * kv_size, kv_size, "k"),
                heads(kv_rank * kv_size, kv_size, "v"),
            ]
        else:
            kv_total = (rows - q_total) // 2
            k_start = q_total + kv_rank * kv_size
            v_start = q_total + kv_total + kv_rank * kv_size
            parts = [
                take(q_rank * q_size, (q_rank + 1) * q_size),
                take(k_start, k_start + kv_size),
                take(v_start, v_start + kv_size),
            ]
        if is_storage_transposed or in_out:
            parts = [part.T for part in parts]
        return torch.cat(parts, dim=-1 if is_storage_transposed or in_out else 0)

    return SafetensorsWeightLoader(transform)
'''

PART_CODE = f'''
def {PART}(part, num_parts, shard_size, num_shards, is_storage_transposed=False):
    """Loader for this rank's shard of one part of a checkpoint tensor made of
    num_parts equal blocks on its first dimension (Phi-3 gate_up_proj:
    [gate | up]); a weight comes out transposed with is_storage_transposed."""

    def transform(slices, rank):
        if len(slices) != 1:
            raise ValueError(f"{PART} takes one fused tensor, got {{len(slices)}}")
        rows = slices[0].get_shape()[0]
        if rows % num_parts != 0:
            raise ValueError(f"{PART}: {{rows}} rows do not split into {{num_parts}} parts")
        start = part * (rows // num_parts) + (rank % num_shards) * shard_size
        shard = slices[0][start : start + shard_size]
        return shard.T if is_storage_transposed else shard

    return SafetensorsWeightLoader(transform)
'''


def split_loader_edit(module: cst.Module, layout: str, groups: int, order: str):
    """The edit of a ``fused_qkv_weight_loader(...)`` / ``fused_qkv_bias_loader(...)``
    call into ``fused_qkv_split_loader(...)`` for the fused tensor's ``layout``
    (``concatenated``, ``per_head``, ``grouped``: ``groups`` groups of rows in
    the order ``order``, ``kv_groups``: a group per KV head), keeping the keyword arguments it takes."""
    per_head = layout in ("per_head", "grouped", "kv_groups")
    grouped = layout == "grouped"

    def edit(updated: cst.Call) -> cst.Call:
        kept = [a for a in updated.args if a.keyword is not None and a.keyword.value in QKV_KWARGS]
        if kept and kept[-1] is not updated.args[-1]:
            kept[-1] = kept[-1].with_changes(comma=updated.args[-1].comma)
        call = updated.with_changes(func=cst.Name(QKV_SPLIT), args=kept)
        if per_head:
            call = set_keyword(call, "per_head", parse_expr("True", module))
            call = set_keyword(call, "head_dim", parse_expr("self.head_dim", module))
        if grouped:
            call = set_keyword(call, "groups", parse_expr(str(groups), module))
            call = set_keyword(call, "order", parse_expr(f'"{order}"', module))
        if layout == "kv_groups":
            call = set_keyword(call, "kv_groups", parse_expr("True", module))
        return call

    return edit


def entry_param(key: str) -> str:
    """The parameter a mapping key is for: its last segment, without the
    ``{suffix}`` of a variant's copy (``gate_proj_weight{suffix}``: the FP8
    ``_cte``/``_tkg``/``_plain`` buffers)."""
    leaf = key.rsplit(".", 1)[-1]
    if leaf.endswith("}") and leaf.count("{") == 1 and not leaf.startswith("{"):
        return leaf[: leaf.index("{")]
    return leaf


def part_loader_edit(part: int):
    def edit(updated: cst.Call) -> cst.Call:
        args = [a for a in updated.args if not (a.keyword is not None and a.keyword.value == "shard_dim")]
        if args and updated.args[-1] not in args:
            args[-1] = args[-1].with_changes(comma=updated.args[-1].comma)
        first_comma = args[0].comma if args else cst.MaybeSentinel.DEFAULT
        new = [
            cst.Arg(
                keyword=cst.Name("part"),
                value=cst.Integer(str(part)),
                equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")),
                comma=first_comma,
            ),
            cst.Arg(
                keyword=cst.Name("num_parts"),
                value=cst.Integer("2"),
                equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")),
                comma=first_comma,
            ),
        ]
        return updated.with_changes(func=cst.Name(PART), args=[*new, *args])

    return edit


PER_EXPERT_GATE_UP = re.compile(r"\.experts\.\{[^}]*\}\.(gate_proj|up_proj|w1|w3)\b")
FUSED_EXPERTS = re.compile(r"\.experts\.gate_up_proj\b")  # a mapping that takes the fused key too


def subscript_assignments(module: cst.Module) -> list[cst.Assign]:
    """Every ``x[...] = value`` of the module."""
    found: list[cst.Assign] = []

    class Visitor(cst.CSTVisitor):
        def visit_Assign(self, node: cst.Assign) -> None:
            if isinstance(node.targets[0].target, cst.Subscript):
                found.append(node)

    module.visit(Visitor())
    return found


def add_function_after(module: cst.Module, name: str, code: str, after_class: str) -> cst.Module:
    """The function ``code`` (named ``name``) added after the class
    ``after_class``, unless the module defines it already."""
    if any(isinstance(s, cst.FunctionDef) and s.name.value == name for s in module.body):
        return module
    helper = parse_statement(code.strip("\n"), module)
    assert isinstance(helper, cst.FunctionDef), code
    helper = helper.with_changes(leading_lines=[cst.EmptyLine(indent=False), cst.EmptyLine(indent=False)])
    body = list(module.body)
    index = next(i for i, s in enumerate(body) if isinstance(s, cst.ClassDef) and s.name.value == after_class)
    body.insert(index + 1, helper)
    return module.with_changes(body=body)
