"""An attention one module down whose wrapper only passes it through
(GPT-Neo's ``GPTNeoAttention``, whose forward returns
``self.attention(hidden_states, ...)`` as it is): research reads the
attention inside as the layer's own, under the wrapper's name."""

from __future__ import annotations

from typing import Any

from autoport_cst.research.analysis.state import AnalyzerState
from autoport_cst.research.interp.values import Instance, Node


def inner_attention(st: AnalyzerState, wrapper: Instance) -> tuple[str, Instance] | None:
    """``(name, attention)`` when ``wrapper`` has one attention child and
    every path of its forward returns what that child returns, unchanged."""
    if st.role(wrapper) == "attention":
        return None
    inner = [(n, c) for n, c in wrapper.children() if "." not in n and st.role(c) == "attention"]
    others = [c for n, c in wrapper.children() if st.role(c) not in ("attention", "dropout")]
    if len(inner) != 1 or others:
        return None
    paths = st.forward(wrapper)
    if not paths or not all(_returns_call(p.value, inner[0][1]) for p in paths):
        return None
    return inner[0]


def _returns_call(value: Any, inner: Instance) -> bool:
    return isinstance(value, Node) and value.kind == "module" and value.ref is inner


def splice(st: AnalyzerState, layers: list[Instance]) -> str | None:
    """In every layer, the pass-through wrapper's attribute holds the
    attention inside it; the wrapper's name then (None when no layer's
    child is such a wrapper)."""
    found = None
    for layer in layers:
        for name, child in list(layer.children()):
            if "." in name:
                continue
            inner = inner_attention(st, child)
            if inner is None:
                continue
            layer.attrs[name] = inner[1]
            found = f"{name}.{inner[0]}"
    if found is not None:
        st.reset_caches()
    return found
