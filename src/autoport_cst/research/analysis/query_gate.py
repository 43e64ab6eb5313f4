"""An output gate fused with the queries: one input projection whose rows
hold, head after head, the head's query and the gate of that head's
attention output (MiniCPM5-MoE's ``q_gate_proj``: ``view(..., -1, 2 *
head_dim).chunk(2, dim=-1)``, the attention output times ``gate.sigmoid()``
before the output projection, Qwen3-Next style).

Counted as a query projection its width reads as twice the query heads (or
as extra KV heads). The layout is read by what the code computes: the
traced operations between the projection and the kernel's query, and
between it and the sigmoid's argument, run on the projection's row numbers
(:mod:`.qkv_rows`); the gate is fused per head when query head ``h`` reads
rows ``2 h d .. 2 h d + d - 1`` and element ``(h, i)`` of the gate reads row
``2 h d + d + i`` (``d`` the head size). Then the spec's
``attention.output_gate`` is ``sigmoid``, the checkpoint's
``checkpoint.output_gate`` ``fused_query_per_head`` and the projection names
both the query (``self_attn.q_proj``) and the gate (``self_attn.gate_proj``);
its gate rows are left out of the head counts. Any other split of such a
projection is named as what it computes (``unsupported.attention_output_gate``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from autoport_cst.research.analysis import qkv_rows
from autoport_cst.research.analysis.graph import kernel_calls
from autoport_cst.research.analysis.state import AnalyzerState, AttentionGraph
from autoport_cst.research.findings import CODE, known
from autoport_cst.research.interp.values import Node
from autoport_cst.research.interp.walk import depends_on

LAYOUT = "fused_query_per_head"


def split(st: AnalyzerState, g: AttentionGraph) -> AttentionGraph:
    """``g`` with the gate rows of a projection that fuses the queries and
    their output gate counted out (``gate_rows``); ``g`` itself when no
    input projection both feeds the kernel and gates its output."""
    kernels = kernel_calls(g.attn, g.nodes)
    if not kernels:
        return g
    for call in g.inputs:
        factors = _gate_factors(g.nodes, call, kernels)
        if not factors or not any(depends_on(k, call) for k in kernels):
            continue
        name = call.ref.name or "?"
        what = (
            f"{g.where}: {name} feeds the attention kernel and, through {factors[0].name}, multiplies its "
            "output before the output projection"
        )
        rows, differs = _probe(st, g, call, factors)
        gate_rows = call.ref.args.get("out_features", 0) // 2
        if differs is not None:
            st.add(
                known(
                    "a gate on the attention output",
                    "unsupported.attention_output_gate",
                    CODE,
                    f"{what}; {differs}",
                )
            )
            return replace(g, gate_rows=gate_rows)  # its width is still no query heads'
        st.add(known("sigmoid", "attention.output_gate", CODE, f"{what}: sigmoid, one gate per element"))
        st.add(
            known(
                LAYOUT,
                "code.output_gate_layout",
                CODE,
                f"{what}: its rows are, head after head, the head's query then its gate ({rows} rows each)",
            )
        )
        st.result.module_names["self_attn.gate_proj"] = f"{st.attn_path or st.attn_name}.{name}"
        return replace(g, gate_rows=gate_rows)
    return g


def _gate_factors(nodes: list[Node], proj: Node, kernels: list[Node]) -> list[Node]:
    """The sigmoids of ``proj``'s output that multiply a kernel's output."""
    found = []
    for n in nodes:
        if n.kind == "binop" and n.name == "mul" and len(n.args) == 2:
            for x, y in (n.args, n.args[::-1]):
                if (
                    isinstance(x, Node)
                    and x.kind in ("call", "method")
                    and x.name.rsplit(".", 1)[-1] == "sigmoid"
                    and x.args
                    and depends_on(x, proj)
                    and not any(depends_on(x, k) for k in kernels)
                    and any(depends_on(y, k) for k in kernels)
                ):
                    found.append(x)
    return found


def _probe(st: AnalyzerState, g: AttentionGraph, proj: Node, factors: list[Node]) -> tuple[int, str | None]:
    """(head size, None) when the projection's rows are each head's query
    then its gate; else what the rows read are instead."""
    nh, hd = st.dims.get("num_heads"), g.attn.attrs.get("head_dim", st.dims.get("head_dim"))
    width = proj.ref.args.get("out_features")
    if not (isinstance(nh, int) and isinstance(hd, int) and width == 2 * nh * hd):
        return 0, f"{proj.ref.name} is {width} wide, not a query and a gate per head ({nh} x 2 x {hd})"
    for q, _k, _v in qkv_rows.attention_operands(st, g.attn, g.nodes):
        try:
            run = _Run(st, proj, width)
            query = qkv_rows.head_rows(run.value(q))
            gates = [_gate_rows(run.value(f.args[0])) for f in factors]
        except qkv_rows.PROBE_ERRORS:
            continue
        wanted_q = [tuple(range(2 * h * hd, 2 * h * hd + hd)) for h in range(nh)]
        wanted_g = tuple(r + hd for rows in wanted_q for r in rows)
        if query == wanted_q and all(gate == wanted_g for gate in gates):
            return hd, None
        return 0, f"its rows split otherwise (query heads read rows starting {[r[0] for r in query]})"
    return 0, "the split of its rows could not be followed"


def _gate_rows(tensor: Any) -> tuple[int, ...]:
    """The rows each element of the gate reads, at the first position
    (``[batch, positions, heads * head_dim]``, or with heads and
    head_dim apart)."""
    import torch

    if not isinstance(tensor, torch.Tensor) or tensor.dim() < 3 or tensor.shape[1] != qkv_rows.POSITIONS:
        raise qkv_rows.NotRun("not a [batch, positions, ...] gate")
    return tuple(int(r) for r in tensor[0, 0].flatten().tolist())


class _Run(qkv_rows.Run):
    """The probe of :mod:`.qkv_rows`, the other projections' outputs taken
    as zeros: the keys the RoPE function rotates with the queries are not
    read here."""

    def _node(self, node: Node) -> Any:
        import torch

        if (
            node.kind == "module"
            and node is not self.proj
            and isinstance(node.ref.args.get("out_features"), int)
        ):
            return torch.zeros(1, qkv_rows.POSITIONS, node.ref.args["out_features"], dtype=torch.float64)
        return super()._node(node)
