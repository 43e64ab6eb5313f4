"""The RoPE section: which layers apply no rotation, the rotation function's
style (halves or interleaved pairs, read from its slicing), the rotary
dimension (``torch.arange(0, dim, 2)`` in the rotary module's inverse
frequencies, over head_dim), and no rotary embedding at all."""

from __future__ import annotations

from autoport_cst.research.analysis.graph import ranges, rotation_style
from autoport_cst.research.analysis.state import AnalyzerState, AttentionGraph
from autoport_cst.research.findings import CODE, known, unknown
from autoport_cst.research.interp import MODULE_LIST, FuncRef, Instance, SourceClass, depends_on, walk


def analyze(st: AnalyzerState, g: AttentionGraph) -> None:
    """RoPE as the first layer's attention ``g`` applies it, and per layer."""
    _nope_layers(st, g.where)
    _style(st, g)


def _nope_layers(st: AnalyzerState, where: str) -> None:
    """Layers whose attention applies no rotation (``st.layer_rotation``,
    recorded by the attention section for every traced layer)."""
    rotary = st.layer_rotation
    if rotary and not all(rotary) and any(rotary):
        nope = tuple(i for i, r in enumerate(rotary) if not r)
        st.add(
            known(
                nope, "rope.nope_layers", CODE, f"{where}: no rotation applied on layers {ranges(list(nope))}"
            )
        )
    elif rotary and all(rotary):
        st.add(known(None, "rope.nope_layers", CODE, f"{where}: rotation applied on every layer"))
    elif rotary:
        st.no_rotation = True
        st.add(known(None, "rope.nope_layers", CODE, f"{where}: no layer applies a rotation"))


def _style(st: AnalyzerState, g: AttentionGraph) -> None:
    """The rotation function applied to the projections: its style."""
    nodes, inputs, where = g.nodes, g.inputs, g.where
    funcs = [
        n
        for n in nodes
        if n.kind == "func"
        and isinstance(n.ref, FuncRef)
        and any(depends_on(arg, c) for arg in n.args for c in inputs)
    ]
    styles = {}
    for n in funcs:
        style = rotation_style(n.ref, st.interp)
        if style is not None:
            styles[n.ref.name] = style
    if not styles:
        rotary = _find_rotary(st)
        if rotary is None or st.no_rotation:
            st.add(
                known(
                    "none", "rope.type", CODE, f"{where}: no rotary embedding module and no rotation applied"
                )
            )
        else:
            st.add(unknown("rope.style", CODE, f"{where}: rotation function not recognised"))
        return
    values = set(styles.values())
    names = ", ".join(f"{k} ({v})" for k, v in styles.items())
    if len(values) == 1:
        st.add(known(values.pop(), "rope.style", CODE, f"{where}: {names}"))
    else:
        st.add(unknown("rope.style", CODE, f"{where}: {names}"))
    _rotary_dim(st, where)


def _find_rotary(st: AnalyzerState) -> Instance | None:
    """The first rotary-embedding module under the causal LM (breadth first)."""
    stack = [st.top]
    seen = 0
    while stack and seen < 256:
        inst = stack.pop(0)
        seen += 1
        for _, child in inst.children():
            if st.role(child) == "rotary":
                return child
            if not child.is_external and child.cls != MODULE_LIST and "." not in (child.name or ""):
                stack.append(child)
    return None


def _rotary_dim(st: AnalyzerState, where: str) -> None:
    """The partial rotary factor: the inverse frequencies' dimension over head_dim."""
    rotary = _find_rotary(st)
    hd = st.dims.get("head_dim")
    if rotary is None or not isinstance(rotary.cls, SourceClass):
        st.add(unknown("rope.partial_rotary_factor", CODE, f"{where}: rotary embedding module not found"))
        return
    interp = st.interp
    dims = []
    for name in ("compute_default_rope_parameters", "__init__"):
        found = interp.find_method(rotary.cls, name)
        if found is None:
            continue
        klass, fn = found
        args = [interp.config] if name != "__init__" else [Instance(rotary.cls), interp.config]
        try:
            states = interp.call_function(klass.module, fn, args, {}, owner=klass)
        except RecursionError:  # pragma: no cover
            states = []
        for state in states:
            for value in [state.value, *state.env.values()]:
                for n in walk(value):
                    if (
                        n.kind == "call"
                        and n.name.endswith("arange")
                        and len(n.args) >= 3
                        and n.args[0] == 0
                        and n.args[2] == 2
                        and isinstance(n.args[1], int)
                    ):
                        dims.append(n.args[1])
        if dims:
            evidence = f"{klass.name}.{name}: inv_freq over {dims[0]} of head_dim {hd}"
            break
    if not dims or not isinstance(hd, int):
        st.add(
            unknown(
                "rope.partial_rotary_factor",
                CODE,
                f"{where}: rotary dimension not computable from {rotary.class_name}",
            )
        )
        return
    if len(set(dims)) != 1:
        st.add(unknown("rope.partial_rotary_factor", CODE, f"{where}: rotary dims {sorted(set(dims))}"))
        return
    st.add(known(dims[0] / hd, "rope.partial_rotary_factor", CODE, evidence))
