"""Which of an MoE block's expert modules the router chooses among.

A block may hold two modules of 3-D expert parameters: the routed experts
and a stack of always-on shared experts (Inkling: ``experts`` and
``shared_experts``, both ``[n, width, hidden]``). The routed ones are the
module whose forward selects one expert's weights by a computed index
(``self.gate_up_proj[expert_idx]``); a stack that multiplies every expert's
weights on every token (``torch.bmm``) is shared. Taking the last one
declared read Inkling's two shared experts as the routed ones.
"""

from __future__ import annotations

import ast
from typing import Any

from autoport_cst.research.analysis.state import AnalyzerState
from autoport_cst.research.findings import CODE, known, unknown
from autoport_cst.research.interp.values import Instance, Node
from autoport_cst.research.interp.walk import walk


def selects_per_expert(st: AnalyzerState, experts: Instance) -> bool:
    """Whether the module's forward indexes one of its parameters by a
    computed value (one expert's weights chosen per routed expert)."""
    for out in st.outputs(experts):
        for n in walk(out):
            if n.kind != "item" or not n.args:
                continue
            target = n.args[0]
            if isinstance(target, Node) and target.kind == "param" and _computed(n.args[1:]):
                return True
    return False


def _computed(index: Any) -> bool:
    """An index holding a computed value (not only slices and constants)."""
    stack = [index]
    while stack:
        current = stack.pop()
        if isinstance(current, Node):
            return True
        if isinstance(current, (tuple, list)):
            stack.extend(current)
    return False


def routed_among(
    st: AnalyzerState, stacked: list[tuple[str, Instance]]
) -> tuple[tuple[str, Instance] | None, list[tuple[str, Instance]]]:
    """The routed module among several stacks of expert parameters and the
    others (shared); the last one declared and none other when no single
    stack selects per expert (the reading before this module)."""
    if len(stacked) < 2:
        return (stacked[-1] if stacked else None), []
    selecting = [(n, c) for n, c in stacked if selects_per_expert(st, c)]
    if len(selecting) != 1:
        return stacked[-1], []
    return selecting[0], [(n, c) for n, c in stacked if c is not selecting[0][1]]


def stacked_count(experts: Instance) -> int | None:
    """How many experts a module of 3-D parameters holds (their first
    dimension, when every 3-D parameter agrees)."""
    firsts = {p.shape[0] for _, p in experts.params() if p.shape and len(p.shape) == 3}
    return firsts.pop() if len(firsts) == 1 else None


def stacked_shared(st: AnalyzerState, stacked: list[tuple[str, Instance]], mlps: int, where: str) -> None:
    """Shared experts stored stacked (Inkling's ``shared_experts``: ``[n,
    width, hidden]`` parameters run on every token): counted, and refused."""
    counts = [stacked_count(c) for _, c in stacked]
    names = ", ".join(
        f"{n} ({k if k is not None else '?'} experts)" for (n, _), k in zip(stacked, counts, strict=True)
    )
    evidence = f"{where}: always-on experts stacked as 3-D parameters: {names}"
    if None in counts:
        st.add(unknown("moe.shared_experts", CODE, evidence))
    else:
        st.add(known(mlps + sum(c for c in counts if c is not None), "moe.shared_experts", CODE, evidence))
    # their gate (Inkling's router-given gammas) is why no shared-expert gate was read
    st.add(known(("moe.shared_expert_gate",), "unsupported.stacked_shared_experts", CODE, evidence))


def uncast(expr: ast.expr) -> ast.expr:
    """For the routing bias held as a buffer (moe._added_buffers):
    ``self.x.float()`` / ``self.x.to(...)`` read as ``self.x`` (Inkling
    adds ``self.e_score_correction_bias.float()``)."""
    while (
        isinstance(expr, ast.Call)
        and isinstance(expr.func, ast.Attribute)
        and expr.func.attr in ("float", "to", "type_as", "half", "bfloat16", "double")
    ):
        expr = expr.func.value
    return expr
