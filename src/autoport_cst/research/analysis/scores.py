"""Attention written out instead of an attention kernel call: the scores
``q @ k^T`` (``torch.matmul`` or ``@``) of the input projections, the scalar
they are scaled by, the attention mask added to them before the softmax,
and from that mask the sliding window (none when it is transformers' plain
causal mask: :func:`layer_inputs.plain_causal_mask`). What a kernel's
arguments say for attention that calls one (scale, softcap, sinks, window),
read from the computation itself."""

from __future__ import annotations

import math
from typing import Any

from autoport_cst.research.analysis import layer_inputs
from autoport_cst.research.analysis.graph import scalar_path, strip_casts
from autoport_cst.research.analysis.state import AnalyzerState
from autoport_cst.research.findings import CODE, INFERRED, known, unknown
from autoport_cst.research.interp.values import UNKNOWN, Node
from autoport_cst.research.interp.walk import depends_on


def analyze(st: AnalyzerState, nodes: list[Node], inputs: list[Node], where: str, hd: Any) -> None:
    """Attention written out (matmul, softmax) instead of a kernel call:
    the scale is the scalar applied to q @ k^T (``torch.matmul`` or ``@``)
    before an attention mask the forward is given is added."""
    scores = _score_products(nodes, inputs)
    softmax = _softmaxes(nodes)
    if not scores or not softmax:
        st.add(unknown("attention.scale", CODE, f"{where}: attention kernel call not found"))
        return
    logits, _ = _score_masks(softmax[0])
    factor, ops, reached = scalar_path(logits, lambda v: any(v is s for s in scores))
    if not reached or not isinstance(hd, int):
        st.add(unknown("attention.scale", CODE, f"{where}: scores scaling not traced"))
        return
    default = hd**-0.5
    if math.isclose(factor, default, rel_tol=1e-9):
        st.add(known(None, "attention.scale", CODE, f"{where}: scores scaled by head_dim ** -0.5"))
    else:
        st.add(
            known(float(factor), "attention.scale", CODE, f"{where}: scores {' '.join(ops) or 'unscaled'}")
        )
    st.add(
        known(
            False,
            "attention.sinks",
            CODE,
            f"{where}: explicit softmax over the scores only",
            confidence=INFERRED,
        )
    )
    if any(
        n.kind == "call" and n.name.endswith("tanh") and any(depends_on(n, s) for s in scores) for n in nodes
    ):
        st.add(unknown("attention.softcap", CODE, f"{where}: tanh applied to the scores"))
    else:
        st.add(known(None, "attention.softcap", CODE, f"{where}: no tanh on the scores"))


def _score_products(nodes: list[Node], inputs: list[Node]) -> list[Node]:
    """The products of two tensors both computed from the input projections
    (the scores q @ k^T)."""
    return [
        n
        for n in nodes
        if n.kind in ("call", "binop")
        and n.name.rsplit(".", 1)[-1] == "matmul"
        and len(n.args) == 2
        and all(any(depends_on(a, c) for c in inputs) for a in n.args)
    ]


def _softmaxes(nodes: list[Node]) -> list[Node]:
    return [n for n in nodes if n.kind in ("call", "method") and n.name.rsplit(".", 1)[-1] == "softmax"]


def _score_masks(softmax: Node) -> tuple[Any, list[str]]:
    """The softmax's input without the tensors the forward is given and adds
    to it as they are (an attention mask), and those parameters' names."""
    value = strip_casts(softmax.args[0]) if softmax.args else None
    masks: list[str] = []
    while isinstance(value, Node) and value.kind == "binop" and value.name == "add":
        given = [a for a in value.args if isinstance(a, Node) and a.kind == "input"]
        if len(given) != 1:
            break
        masks.append(given[0].name)
        value = strip_casts(next(a for a in value.args if a is not given[0]))
    return value, masks


def window(st: AnalyzerState, index: int, nodes: list[Node]) -> Any:
    """The sliding window of attention written out on layer ``index``: None
    when the scores are masked by what transformers' causal mask builds
    (:func:`layer_inputs.plain_causal_mask`), unknown otherwise."""
    softmax = _softmaxes(nodes)
    if len(softmax) != 1:
        return UNKNOWN
    _, masks = _score_masks(softmax[0])
    if len(masks) == 1 and layer_inputs.plain_causal_mask(st, index, masks[0]):
        return None
    return UNKNOWN
