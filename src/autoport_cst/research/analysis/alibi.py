"""ALiBi read: the slopes of the bias the backbone builds per head, and where
the attention adds it to its scores.

:func:`.block_features.score_bias` finds a tensor the backbone builds with
the head count and the attention adds to its scores; :func:`read` reads it as
the spec's ``attention.alibi_bias_max`` and ``attention.alibi_scaled`` when

- its builder, a function of the modeling source, computes ALiBi's slopes of
  one ``bias_max`` for the model's head count and for others (run with the
  arguments bound at the call: :mod:`autoport_cst.research.alibi_values`),
  either as the bias along the positions (MPT's ``build_mpt_alibi_tensor``)
  or as slopes that the value given to the layers multiplies by
  ``torch.arange`` positions (BLOOM's ``_get_alibi_slopes``);
- the attention adds that value to its scores in one way: ``scores + bias``
  after the scale (MPT), ``bias.baddbmm(q, k, beta=1, alpha=scale)`` (BLOOM),
  or ``(scores + bias) * scale`` (``alibi_scaled``: Falcon-RW's eager
  form; Falcon-RW is named ``alibi_in_mask`` before this is read, by
  :func:`.block_features.score_bias`: its backbone folds the bias into the
  attention mask too, which the scores add as well).

Anything else stays refused (``unsupported.alibi_positions``), with what was
not read.

The attention is then written out (no kernel takes a bias): what a kernel's
arguments would say is read from the scores with the bias taken off
(:func:`written_out`): the scale (the numbers multiplying ``q @ k^T``, or
``baddbmm``'s ``alpha``), no sinks (a softmax over the scores alone), no
softcap (no ``tanh``), and no window when the one mask left is the plain
causal mask of ``create_causal_mask`` (added, or a boolean ``masked_fill``).
"""

from __future__ import annotations

import math
from typing import Any

from autoport_cst.research.alibi_values import PROBED_HEADS, alibi_bias_max
from autoport_cst.research.analysis import scale_source
from autoport_cst.research.analysis.graph import strip_casts
from autoport_cst.research.analysis.layer_inputs import CAUSAL_MASK, MASK_OVERLAYS, attention_argument
from autoport_cst.research.analysis.state import AnalyzerState
from autoport_cst.research.findings import CODE, INFERRED, known, unknown
from autoport_cst.research.interp.values import FuncRef, Instance, Node
from autoport_cst.research.interp.walk import walk

# ops between the bias input and the add that change no value
_CARRIERS = {"view", "reshape", "to", "float", "type_as", "contiguous", "expand", "unsqueeze"}


def read(
    st: AnalyzerState, builder: Node, value: Any, scores: list[Any], attn: Instance, name: str
) -> str | None:
    """Add the ALiBi findings of the bias ``value`` (argument ``name`` of the
    layers, built by ``builder``) and return None; or return why it is not read."""
    heads = st.dims.get("num_heads")
    if not isinstance(builder.ref, FuncRef) or not isinstance(heads, int) or st.backbone is None:
        return f"{builder.name} is no function of the modeling source"
    index = next(i for i, a in enumerate(builder.args) if a == heads and not isinstance(a, bool))
    slopes = alibi_bias_max(builder.ref.module.dotted, builder.ref.name, tuple(builder.args), index)
    if slopes is None:
        return f"{builder.name} computes no ALiBi slopes 2 ** -(bias_max * i / n) of one bias_max"
    bias_max, per_position = slopes
    if not per_position and not any(
        isinstance(n, Node) and n.name.rsplit(".", 1)[-1] == "arange" for n in walk(value)
    ):
        return f"the slopes of {builder.name} are not multiplied by the positions (torch.arange)"
    places: set[bool | None] = set()
    for score in scores:
        _adds(score, name, False, places)
    if len(places) != 1 or None in places:
        return f"{st.where(attn)} adds {name} to its scores in a way not read (scale, baddbmm beta)"
    scaled = places.pop()
    positions = "as slope * (position - last position)" if per_position else "times torch.arange positions"
    evidence = (
        f"{builder.name} in {st.where(st.backbone)} computes ALiBi slopes 2 ** -({bias_max:g} * i / n) "
        f"(run for {heads} heads and {', '.join(map(str, PROBED_HEADS))}), {positions}; {st.where(attn)} "
        f"adds them to its scores ({name}) {'before' if scaled else 'after'} the scale"
    )
    st.add(known(bias_max, "attention.alibi_bias_max", CODE, evidence))
    st.add(known(scaled, "attention.alibi_scaled", CODE, evidence))
    written_out(st, attn, scores, name)
    return None


def written_out(st: AnalyzerState, attn: Instance, scores: list[Any], name: str) -> None:
    """The scale, sinks, softcap and window of attention written out with the
    ALiBi bias ``name`` added to its scores (each read on the first softmax)."""
    where = st.where(attn)
    peeled = _peel(scores[0], name) if scores else None
    hd = st.dims.get("head_dim")
    if peeled is None or not isinstance(hd, int):
        st.add(unknown("attention.scale", CODE, f"{where}: scores scaling not traced past the ALiBi bias"))
        return
    factor, masks = peeled
    if math.isclose(factor, hd**-0.5, rel_tol=1e-9):
        st.add(known(None, "attention.scale", CODE, f"{where}: scores scaled by head_dim ** -0.5"))
    else:
        st.add(known(float(factor), "attention.scale", CODE, f"{where}: scores scaled by {factor:g}"))
    scale_source.written_out(st, attn, where, hd)
    st.add(
        known(False, "attention.sinks", CODE, f"{where}: softmax over the scores only", confidence=INFERRED)
    )
    if any(isinstance(n, Node) and n.name.rsplit(".", 1)[-1] == "tanh" for s in scores for n in walk(s)):
        st.add(unknown("attention.softcap", CODE, f"{where}: tanh applied to the scores"))
    else:
        st.add(known(None, "attention.softcap", CODE, f"{where}: no tanh on the scores"))
    if len(masks) == 1 and _plain_causal(st, masks[0]):
        st.add(
            known("none", "attention.sliding_window", CODE, f"{where}: {masks[0]} is the plain causal mask")
        )
    else:
        st.add(unknown("attention.sliding_window", CODE, f"{where}: masks {masks} not the plain causal mask"))


def _peel(value: Any, name: str) -> tuple[float, list[str]] | None:
    """``(scale, masks)``: the numbers multiplying ``q @ k^T`` and the
    forward's inputs added or filled in as masks, walking from the softmax's
    input down to the product; None when something else is met."""
    factor, masks = 1.0, list[str]()
    value = _carried(value)
    for _ in range(16):
        if not isinstance(value, Node):
            return None
        short = value.name.rsplit(".", 1)[-1]
        if value.kind in ("call", "binop", "method") and short in ("matmul", "bmm"):
            return factor, masks
        if value.kind == "method" and short == "baddbmm" and _is_input(value.args[0], name):
            return factor * float(value.kwarg("alpha", 1.0)), masks
        args = list(value.args)
        filled = (
            _input_name(args[1])
            if value.kind == "method" and short == "masked_fill" and len(args) >= 2
            else None
        )
        if filled is not None:
            masks.append(filled)
            value = _carried(args[0])
        elif value.kind == "binop" and short == "add" and len(args) == 2:
            given = [a for a in args if _is_input(a, name) or _input_name(a)]
            if len(given) != 1:
                return None
            mask = None if _is_input(given[0], name) else _input_name(given[0])
            if mask is not None:
                masks.append(mask)
            value = _carried(next(a for a in args if a is not given[0]))
        elif value.kind == "binop" and short in ("mul", "div") and len(args) == 2:
            numbers = [a for a in args if isinstance(a, (int, float)) and not isinstance(a, bool)]
            if len(numbers) != 1 or (short == "div" and args[1] is not numbers[0]):
                return None
            factor = factor * numbers[0] if short == "mul" else factor / numbers[0]
            value = _carried(next(a for a in args if a is not numbers[0]))
        else:
            return None
    return None


def _carried(value: Any) -> Any:
    value = strip_casts(value)
    while isinstance(value, Node) and value.kind == "method" and value.name in _CARRIERS and value.args:
        value = strip_casts(value.args[0])
    return value


def _input_name(value: Any) -> str | None:
    value = strip_casts(value)
    return value.name if isinstance(value, Node) and value.kind == "input" else None


def _plain_causal(st: AnalyzerState, name: str) -> bool:
    """The attention parameter ``name`` of layer 0 is, on every path, the mask
    ``create_causal_mask`` builds with no overlay (a cast of it allowed)."""
    values = [strip_casts(v) for v in attention_argument(st, 0, name)]
    return bool(values) and all(
        isinstance(v, Node)
        and v.kind == "call"
        and v.name == CAUSAL_MASK
        and not any(key in MASK_OVERLAYS for key, _ in v.kwargs)
        for v in values
    )


def _adds(node: Any, name: str, scaled: bool, places: set) -> None:
    """Record in ``places``, for each node adding the input ``name`` to the
    scores, whether a product with a number above it scales the sum (None:
    added in a way not read)."""
    if not isinstance(node, Node):
        return
    operands = [*node.args, *(v for _, v in node.kwargs)]
    if any(_is_input(a, name) for a in operands):
        if node.kind == "binop" and node.name == "add":
            places.add(scaled)
        elif node.kind == "method" and node.name == "baddbmm" and _is_input(node.args[0], name):
            places.add(scaled if node.kwarg("beta", 1) == 1 else None)
        else:
            places.add(None)
        return
    by_number = (
        node.kind == "binop"
        and node.name in ("mul", "div")
        and any(isinstance(a, (int, float)) for a in node.args)
    )
    for operand in operands:
        _adds(operand, name, scaled or by_number, places)


def _is_input(value: Any, name: str) -> bool:
    while (
        isinstance(value, Node)
        and value.args
        and (value.kind == "item" or (value.kind == "method" and value.name in _CARRIERS))
    ):
        value = value.args[0]
    return isinstance(value, Node) and value.kind == "input" and value.name == name
