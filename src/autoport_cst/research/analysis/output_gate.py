"""A gate on the attention output: a projection of the layer input that the
attention kernel does not read, multiplied into the kernel's output before
the output projection (AfMoE: ``output = output * torch.sigmoid(
self.gate_proj(hidden_states))``).

Such a projection is not a query, key or value: counted with them its width
reads as extra KV heads (AfMoE's [64, 32, 32, 64] as 4 KV heads where the
config says 2). It is taken out of the attention's input projections and
named as what it computes (``unsupported.attention_output_gate``): no spec
field describes it and no port computes it.
"""

from __future__ import annotations

from dataclasses import replace

from autoport_cst.research.analysis.graph import kernel_calls
from autoport_cst.research.analysis.state import AnalyzerState, AttentionGraph
from autoport_cst.research.findings import CODE, known
from autoport_cst.research.interp.values import Node
from autoport_cst.research.interp.walk import depends_on


def split(st: AnalyzerState, g: AttentionGraph) -> AttentionGraph:
    """``g`` without the input projections the attention kernel does not
    read (each named as an output gate); ``g`` itself when there are none."""
    kernels = kernel_calls(g.attn, g.nodes)
    if not kernels:
        return g
    gates = [
        c for c in g.inputs if not any(depends_on(k, c) for k in kernels) and _multiplies(g.nodes, c, kernels)
    ]
    if not gates or len(gates) == len(g.inputs):
        return g
    refs = [c.ref for c in gates]
    names = sorted({r.name or "?" for r in refs})
    st.add(
        known(
            "a gate on the attention output",
            "unsupported.attention_output_gate",
            CODE,
            f"{g.where}: {', '.join(names)} of the layer input multiplies the attention kernel's output "
            "before the output projection (the kernel does not read it)",
        )
    )
    st.result.qkv_modules = [m for m in st.result.qkv_modules if m.rsplit(".", 1)[-1] not in names]
    return replace(
        g,
        inputs=[c for c in g.inputs if all(c is not x for x in gates)],
        in_insts=[i for i in g.in_insts if not any(i is r for r in refs)],
    )


def _multiplies(nodes: list[Node], gate: Node, kernels: list[Node]) -> bool:
    """Whether a product in ``nodes`` has one factor reading ``gate`` and
    the other a kernel's output."""
    for n in nodes:
        if n.kind == "binop" and n.name == "mul" and len(n.args) == 2:
            for x, y in (n.args, n.args[::-1]):
                if depends_on(x, gate) and any(depends_on(y, k) for k in kernels):
                    return True
    return False
