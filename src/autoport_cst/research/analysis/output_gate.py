"""A gate on the attention output: a projection of the layer input that the
attention kernel does not read, multiplied into the kernel's output before
the output projection (AfMoE: ``output = output * torch.sigmoid(
self.gate_proj(hidden_states))``).

Such a projection is not a query, key or value: counted with them its width
reads as extra KV heads (AfMoE's [64, 32, 32, 64] as 4 KV heads where the
config says 2). It is taken out of the attention's input projections. The
form a port computes (spec ``attention.output_gate = "sigmoid"``) is the
sigmoid of a bias-free linear projection one gate wide per element of every
head, the product taken with nothing else in the gate's factor; its module
is named ``self_attn.gate_proj`` (the checkpoint key a port loads it from).
Any other form (a softplus, one gate per head, a bias or a learned scale in
the gate) is named as what it computes (``unsupported.attention_output_gate``),
with what differs.
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
    what = (
        f"{g.where}: {', '.join(names)} of the layer input multiplies the attention kernel's output "
        "before the output projection (the kernel does not read it)"
    )
    differs = _unported_form(st, g, gates, kernels)
    if differs is None:
        st.add(known("sigmoid", "attention.output_gate", CODE, f"{what}: sigmoid, one gate per element"))
        st.result.module_names["self_attn.gate_proj"] = f"{st.attn_name}.{names[0]}"
    else:
        st.add(
            known(
                "a gate on the attention output",
                "unsupported.attention_output_gate",
                CODE,
                f"{what}; {differs}",
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


# shape-only methods between the gate projection and its sigmoid
_RESHAPES = ("view", "reshape", "contiguous", "view_as", "flatten")


def _unported_form(
    st: AnalyzerState, g: AttentionGraph, gates: list[Node], kernels: list[Node]
) -> str | None:
    """None when the gate is the one form a port computes (module
    docstring); else what differs from it."""
    if len(gates) != 1:
        return f"{len(gates)} gate projections"
    gate = gates[0]
    inst = gate.ref
    name = inst.name or "?"
    if st.base_module(inst) != "Linear":
        return f"{name} is not a linear projection"
    if inst.args.get("bias") is not False:
        return f"{name} has a bias (bias={inst.args.get('bias', 'True by default')})"
    heads, head_dim = st.dims.get("num_heads"), st.dims.get("head_dim")
    width = inst.args.get("out_features")
    if not (isinstance(heads, int) and isinstance(head_dim, int) and width == heads * head_dim):
        return f"{name} is {width} wide, not one gate per element of every head ({heads} x {head_dim})"
    factors = [
        x
        for n in g.nodes
        if n.kind == "binop" and n.name == "mul" and len(n.args) == 2
        for x, y in (n.args, n.args[::-1])
        if depends_on(x, gate) and any(depends_on(y, k) for k in kernels)
    ]
    if not factors or not all(_sigmoid_of(x, gate) for x in factors):
        return f"the factor is not the sigmoid of {name} alone"
    return None


def _sigmoid_of(factor: Node, gate: Node) -> bool:
    """Whether ``factor`` is ``sigmoid(gate)`` (through reshapes only)."""
    if (
        factor.kind not in ("call", "method")
        or factor.name.rsplit(".", 1)[-1] != "sigmoid"
        or not factor.args
    ):
        return False
    inner = factor.args[0]
    while inner is not gate:
        if not (
            isinstance(inner, Node) and inner.kind == "method" and inner.name in _RESHAPES and inner.args
        ):
            return False
        inner = inner.args[0]
    return True
