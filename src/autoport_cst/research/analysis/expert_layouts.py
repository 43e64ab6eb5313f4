"""How a routed block stores and applies its experts, named where no
reference computes it that way, from the code:

- ``split_expert_projections``: each projection of the experts a module of
  its own holding every expert's weights (3-D parameters), the block chaining
  them and applying the activation between them itself (JetMoE's
  ``input_linear`` and ``output_linear``, two ``JetMoeParallelExperts``: gate
  and up fused in the first, chunked and activated in ``JetMoeMoE``);
- ``fused_expert_rows``: every expert's projection stored as one 2-D tensor,
  the experts' rows one after another (``[experts x width, hidden]``), split
  per expert in the forward by a view (DBRX's ``DbrxExpertGLU.w1``, ``v1``,
  ``w2`` viewed as ``(-1, ffn_hidden_size, hidden_size)[expert]``).

Each is an ``unsupported.<name>`` finding whose value is the spec sections it
explains: the experts' MLP research reads as one module of
``act(x W_gate) * (x W_up) W_down`` (``moe.expert_mlp``, the MLP section read
from it) then follows from it."""

from __future__ import annotations

import ast

from autoport_cst.research.analysis.state import AnalyzerState
from autoport_cst.research.findings import CODE, known
from autoport_cst.research.interp.values import Instance, Node, Param, SourceClass
from autoport_cst.research.interp.walk import depends_on, walk

VIEWS = ("view", "reshape")


def name_expert_layouts(st: AnalyzerState, layer: Instance) -> None:
    """Look at the modules of ``layer`` outside its attention for either layout."""
    for inst in _feed_forward_modules(st, layer):
        if _split_projections(st, inst) or _fused_rows(st, inst):
            return


def _feed_forward_modules(st: AnalyzerState, layer: Instance, depth: int = 0) -> list[Instance]:
    """The modules under ``layer``, its attention's subtree left out."""
    out: list[Instance] = []
    for _, child in layer.children():
        if child.is_external or st.role(child) == "attention" or depth > 4:
            continue
        out += [child, *_feed_forward_modules(st, child, depth + 1)]
    return out


def _split_projections(st: AnalyzerState, block: Instance) -> bool:
    """Two children of ``block`` holding 3-D expert weights, the second
    called on what the first returned."""
    banks = {id(c): (n, c) for n, c in block.children() if "." not in n and st.role(c) == "experts"}
    if len(banks) < 2:
        return False
    for value in st.outputs(block)[:1]:
        calls = [n for n in walk(value) if n.kind == "module" and id(n.ref) in banks]
        for later in calls:
            for earlier in calls:
                if earlier.ref is later.ref or not later.args or not depends_on(later.args[0], earlier):
                    continue
                first, second = banks[id(earlier.ref)], banks[id(later.ref)]
                bias = _output_bias(block, value)
                st.add(
                    known(
                        ("moe.expert_mlp", "mlp"),
                        "unsupported.split_expert_projections",
                        CODE,
                        f"{st.where(block)}: the experts' projections are separate modules of every expert's "
                        f"weights, {first[0]} {_shapes(first[1])} then {second[0]} {_shapes(second[1])} "
                        f"({first[1].class_name}), the activation applied between them by {block.class_name}"
                        + (f", which adds {bias} to the combined output" if bias else ""),
                    )
                )
                return True
    return False


def _output_bias(block: Instance, value: object) -> str:
    """The block's own parameter added to its output (JetMoE's ``bias``)."""
    params = {id(p): n for n, p in block.params()}
    for node in walk(value):
        if node.kind == "binop" and node.name == "add":
            for arg in node.args:
                if isinstance(arg, Node) and arg.kind == "param" and id(arg.ref) in params:
                    return f"its parameter {params[id(arg.ref)]}"
    return ""


def _shapes(inst: Instance) -> str:
    return ", ".join(f"{n} {list(p.shape)}" for n, p in inst.params() if p.shape) or "(no parameters)"


def _fused_rows(st: AnalyzerState, owner: Instance) -> bool:
    """2-D parameters of ``owner`` or of a child the forward of ``owner``
    views as 3-D and indexes: every expert's rows in one tensor."""
    if not isinstance(owner.cls, SourceClass):
        return False
    params = _two_d_parameters(owner)
    viewed: list[tuple[str, int]] = []
    for node in ast.walk(owner.cls.node):
        if not (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Call)):
            continue
        func = node.value.func
        if isinstance(func, ast.Attribute) and func.attr in VIEWS:
            path = _self_path(func.value)
            if path in params and len(node.value.args) == 1 and _three_d(node.value.args[0], owner.cls.node):
                viewed.append((path, node.lineno))
    if not viewed:
        return False
    names = list(dict.fromkeys(p for p, _ in viewed))
    shown = ", ".join(f"{p} {list(params[p].shape or ())}" for p in names)
    st.add(
        known(
            ("moe.expert_mlp", "mlp"),
            "unsupported.fused_expert_rows",
            CODE,
            f"{st.where(owner)}: every expert's weights stored as one 2-D tensor, the experts' rows one after "
            f"another ({shown}), split per expert by a view to 3-D and an index "
            f"({owner.cls.module.path.name}:{viewed[0][1]})",
        )
    )
    return True


def _two_d_parameters(owner: Instance) -> dict[str, Param]:
    """``owner``'s 2-D parameters and its children's, by attribute path."""
    found = {n: p for n, p in owner.params() if p.shape is not None and len(p.shape) == 2}
    for name, child in owner.children():
        found |= {f"{name}.{n}": p for n, p in child.params() if p.shape is not None and len(p.shape) == 2}
    return found


def _self_path(expr: ast.expr) -> str | None:
    """``self.a.b`` as ``"a.b"``; None for anything else."""
    parts: list[str] = []
    while isinstance(expr, ast.Attribute):
        parts.append(expr.attr)
        expr = expr.value
    return ".".join(reversed(parts)) if isinstance(expr, ast.Name) and expr.id == "self" and parts else None


def _three_d(arg: ast.expr, cls: ast.ClassDef) -> bool:
    """A shape of three dimensions: a tuple of three, or a name assigned one
    in the class's code (DBRX's ``split_expert_shape = (-1, ffn, hidden)``)."""
    if isinstance(arg, ast.Tuple):
        return len(arg.elts) == 3
    if isinstance(arg, ast.Name):
        return any(
            isinstance(n, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == arg.id for t in n.targets)
            and isinstance(n.value, ast.Tuple)
            and len(n.value.elts) == 3
            for n in ast.walk(cls)
        )
    return False
