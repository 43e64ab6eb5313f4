"""Which rows of a fused QKV projection's output each query, key and value
head reads, found by running the attention's traced split on the row
numbers.

The projection's output is replaced by its row numbers (a ``[1, S, width]``
tensor holding ``0 .. width - 1`` at every position) and the operations the
trace records between it and the attention's query, key and value (the
kernel's arguments, or the operands of the written-out products) are run
with torch: ``view`` / ``reshape`` / ``unflatten`` / ``flatten``, ``split``
/ ``chunk`` / ``unbind``, indexing, ``transpose`` / ``permute``,
``broadcast_to`` / ``expand``, casts, scalar products (a scaled query), a
cache update and a RoPE function (both keep each head's rows: taken as the
tensors they are given). Each head (dimension 1 of the attention's
``[batch, heads, positions, head_dim]``) then shows the rows it reads, and
the layout is read from them:

- ``concatenated``: the query heads, then the KV heads' keys, then their
  values (Falcon-7B's multi-query ``query_key_value``, any ``[q | k | v]``);
- ``per_head_interleaved``: one head's query, key and value in turn, head
  after head (BLOOM, Falcon without multi-query);
- ``kv_groups``: per KV head, its query heads, then its key and its value
  (Falcon-40B/180B's new decoder architecture), with the heads per group.

Anything else (an operation not listed, rows in another order: CodeGen's
groups of [q v k]) reads as None, and the caller keeps its own reading.
Nothing of the modeling module is imported: only the recorded operations run.
"""

from __future__ import annotations

from typing import Any

from autoport_cst.research.analysis.graph import kernel_calls, number, strip_casts
from autoport_cst.research.analysis.state import AnalyzerState
from autoport_cst.research.interp.values import Instance, Node
from autoport_cst.research.interp.walk import depends_on, walk

POSITIONS = 3  # positions of the probed input (not a head count, so no dimension is ambiguous)
# tensor methods run as they are
_METHODS = {
    "view",
    "reshape",
    "unflatten",
    "flatten",
    "split",
    "chunk",
    "unbind",
    "transpose",
    "permute",
    "expand",
    "broadcast_to",
    "unsqueeze",
    "squeeze",
    "narrow",
    "select",
    "size",
}
_SAME = {"contiguous", "to", "float", "type_as", "clone", "half", "bfloat16", "type"}
_TORCH = {"broadcast_to", "split", "chunk", "unbind", "transpose", "flatten", "reshape"}


class _NotRun(Exception):
    """An operation the probe does not run."""


def layout(
    st: AnalyzerState, attn: Instance, nodes: list[Node], proj: Node, nh: int, nkv: int, hd: int
) -> tuple[str, int | None] | None:
    """``(layout, heads per group)`` of the fused projection ``proj`` (a call
    node of the trace), or None when the probe does not run or the rows read
    fit no layout above."""
    width = proj.ref.args.get("out_features") if isinstance(proj.ref, Instance) else None
    if not isinstance(width, int) or width != (nh + 2 * nkv) * hd:
        return None
    for q, k, v in _attention_operands(st, attn, nodes):
        try:
            run = _Run(st, proj, width)
            rows = _head_rows(run.value(q)), _head_rows(run.value(k)), _head_rows(run.value(v))
        except (_NotRun, RuntimeError, TypeError, ValueError, IndexError):
            continue
        return _classify(*rows, nh, nkv, hd)
    return None


def _attention_operands(st: AnalyzerState, attn: Instance, nodes: list[Node]) -> list[tuple[Any, Any, Any]]:
    """The query, key and value the attention consumes: the kernel's three
    arguments after the module on each forward path, or the operands of the
    written-out ``q @ k^T`` and ``probs @ v``."""
    found = []
    for value in st.outputs(attn):
        for call in kernel_calls(attn, list(walk(value))):
            at = next(i for i, x in enumerate(call.args) if isinstance(x, Node) and x.kind == "instance")
            if len(call.args) >= at + 4:
                found.append(tuple(call.args[at + 1 : at + 4]))
    if found:
        return found
    softmax = [n for n in nodes if n.kind in ("call", "method") and n.name.rsplit(".", 1)[-1] == "softmax"]
    products = [
        n
        for n in nodes
        if n.kind in ("call", "binop") and n.name.rsplit(".", 1)[-1] in ("matmul", "bmm") and len(n.args) == 2
    ]
    weighted = [p for p in products if any(depends_on(p.args[0], s) for s in softmax)]
    scores = [
        p
        for p in products
        if p not in weighted and not any(depends_on(a, s) for a in p.args for s in softmax)
    ]
    if len(scores) == 1 and len(weighted) == 1:
        return [(scores[0].args[0], scores[0].args[1], weighted[0].args[1])]
    return []


def _head_rows(tensor: Any) -> list[tuple[int, ...]]:
    """The rows each head reads (dimension 1), at the first position."""
    import torch

    if not isinstance(tensor, torch.Tensor) or tensor.dim() != 4:
        raise _NotRun("not a [batch, heads, positions, head_dim] tensor")
    if tensor.shape[2] != POSITIONS:  # keys transposed for the product: [batch, heads, head_dim, positions]
        tensor = tensor.transpose(2, 3)
    return [tuple(int(r) for r in tensor[0, h, 0].tolist()) for h in range(tensor.shape[1])]


def _classify(
    q: list[tuple[int, ...]], k: list[tuple[int, ...]], v: list[tuple[int, ...]], nh: int, nkv: int, hd: int
) -> tuple[str, int | None] | None:
    def block(start: int) -> tuple[int, ...]:
        return tuple(range(start * hd, (start + 1) * hd))

    if len(q) != nh or nh % nkv or len(k) not in (nkv, nh) or len(v) != len(k):
        return None
    # keys already repeated to the query heads (Falcon-40B's broadcast_to): each KV head's copies
    share = len(k) // nkv
    kv = [k[j * share] for j in range(nkv)], [v[j * share] for j in range(nkv)]
    if any(k[j] != kv[0][j // share] or v[j] != kv[1][j // share] for j in range(len(k))):
        return None
    keys, values = kv
    if q == [block(h) for h in range(nh)] and keys == [block(nh + j) for j in range(nkv)]:
        if values == [block(nh + nkv + j) for j in range(nkv)]:
            return "concatenated", None
    group = nh // nkv + 2
    grouped = (
        q == [block((h // (group - 2)) * group + h % (group - 2)) for h in range(nh)]
        and keys == [block(j * group + group - 2) for j in range(nkv)]
        and values == [block(j * group + group - 1) for j in range(nkv)]
    )
    if grouped:
        return ("per_head_interleaved", None) if group == 3 else ("kv_groups", group)
    return None


class _Run:
    """The traced operations between the projection call and a value, run
    on the projection's row numbers."""

    def __init__(self, st: AnalyzerState, proj: Node, width: int) -> None:
        import torch

        self.st, self.proj = st, proj
        self.rows = torch.arange(width, dtype=torch.float64).repeat(1, POSITIONS, 1)
        source = strip_casts(proj.args[0]) if proj.args else None
        self.source = source
        self.memo: dict[int, Any] = {}

    def value(self, node: Any) -> Any:
        if isinstance(node, (tuple, list)):
            out: list[Any] = []
            for item in node:
                if isinstance(item, Node) and item.kind == "starred":
                    out.extend(self.value(item.args[0]))
                else:
                    out.append(self.value(item))
            return type(node)(out)
        if not isinstance(node, Node):
            if node is None or isinstance(node, (int, float, str, slice)) or node is Ellipsis:
                return node
            raise _NotRun(f"a value {node!r}")
        if id(node) not in self.memo:
            self.memo[id(node)] = self._node(node)
        return self.memo[id(node)]

    def _node(self, node: Node) -> Any:
        import torch

        if node is self.proj:
            return self.rows
        if node is self.source or (node.kind == "input" and self.source is not None and node is self.source):
            return torch.zeros(1, POSITIONS, int(self.proj.ref.args.get("in_features") or 1))
        if node.kind == "attr" and node.name in ("shape", "dtype", "device"):
            return getattr(self.value(node.args[0]), node.name)
        if node.kind == "item":
            base, index = self.value(node.args[0]), self.value(node.args[1])
            return base[index]
        if node.kind == "method":
            return self._method(node)
        if node.kind == "call" and node.name.startswith("torch.") and node.name[6:] in _TORCH:
            return getattr(torch, node.name[6:])(*self.value(node.args), **self._kwargs(node))
        if node.kind == "func" and self.st.is_rotation(node) and len(node.args) >= 2:
            return self.value(node.args[0]), self.value(node.args[1])  # RoPE keeps each head's rows
        if node.kind == "binop" and node.name in ("mul", "div") and len(node.args) == 2:
            tensors = [a for a in node.args if not number(a)]
            if len(tensors) == 1:
                return self.value(tensors[0])  # a scaled query: the same rows
        raise _NotRun(f"{node.kind}:{node.name}")

    def _method(self, node: Node) -> Any:
        name = node.name.rsplit(".", 1)[-1]
        if name == "update" and len(node.args) >= 3:  # cache.update(k, v, i): the keys and values given
            return self.value(node.args[1]), self.value(node.args[2])
        receiver = self.value(node.args[0]) if node.args else None
        if name in _SAME:
            return receiver
        if name not in _METHODS:
            raise _NotRun(f"method {name}")
        return getattr(receiver, name)(*self.value(node.args[1:]), **self._kwargs(node))

    def _kwargs(self, node: Node) -> dict[str, Any]:
        return {key: self.value(value) for key, value in node.kwargs}


# what the output gate fused with the queries (query_gate) runs of this probe
NotRun = _NotRun
Run = _Run
head_rows = _head_rows
attention_operands = _attention_operands
PROBE_ERRORS = (_NotRun, RuntimeError, TypeError, ValueError, IndexError)
