"""Attention written out instead of an attention kernel call: the scores
``q @ k^T`` (``torch.matmul``, ``@`` or ``torch.bmm``) of the input
projections, the scalar they are scaled by (applied to the scores, or to
the queries or keys before the product: XGLM's ``q_proj(x) * scaling``),
the attention mask added to them before the softmax (through reshapes and a
clamp to the dtype's minimum), and from that mask the sliding window (none
when it is transformers' plain causal mask:
:func:`layer_inputs.plain_causal_mask`); which projection gives the
queries, the keys and the values. What a kernel's arguments say for
attention that calls one (scale, softcap, sinks, window), read from the
computation itself."""

from __future__ import annotations

import math
from typing import Any

from autoport_cst.research.analysis import band_mask, layer_inputs
from autoport_cst.research.analysis.graph import number, scalar_path, strip_casts
from autoport_cst.research.analysis.state import AnalyzerState
from autoport_cst.research.findings import CODE, INFERRED, known, unknown
from autoport_cst.research.interp.values import UNKNOWN, Node, TensorInit
from autoport_cst.research.interp.walk import depends_on


def analyze(st: AnalyzerState, nodes: list[Node], inputs: list[Node], where: str, hd: Any) -> bool:
    """Attention written out (matmul, softmax) instead of a kernel call:
    the scale is the scalar applied to q @ k^T (``torch.matmul``, ``@`` or
    ``torch.bmm``) before an attention mask the forward is given is added,
    times the scalars applied to the queries and keys before the product.
    True when the code scales the scores by nothing (GPT-Neo): the scale is
    1 whatever the config, and no config field gives it (recorded)."""
    scores = _score_products(nodes, inputs)
    softmax = _softmaxes(nodes)
    if not scores or not softmax:
        st.add(unknown("attention.scale", CODE, f"{where}: attention kernel call not found"))
        return False
    scaled = _scale(scores, softmax[0], inputs)
    if scaled is None or not isinstance(hd, int):
        st.add(unknown("attention.scale", CODE, f"{where}: scores scaling not traced"))
        return False
    factor, ops = scaled
    default = hd**-0.5
    unscaled = not ops and factor == 1.0
    if math.isclose(factor, default, rel_tol=1e-9):
        st.add(known(None, "attention.scale", CODE, f"{where}: scores scaled by head_dim ** -0.5"))
    else:
        st.add(
            known(float(factor), "attention.scale", CODE, f"{where}: scores {' '.join(ops) or 'unscaled'}")
        )
    if unscaled and not math.isclose(factor, default, rel_tol=1e-9):
        evidence = f"{where}: scores unscaled, 1 whatever the config (no config field read)"
        st.add(known(None, "attention.scale_key", CODE, evidence))
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
    return unscaled and not math.isclose(factor, default, rel_tol=1e-9)


def _scale(scores: list[Node], softmax: Node, inputs: list[Node]) -> tuple[float, list[str]] | None:
    """The scalar the scores reach the softmax multiplied by (on the scores,
    or on the queries or keys before the product) and its operations."""
    logits, _ = _score_masks(softmax)
    reached_at: list[Node] = []

    def at_scores(value: Any) -> bool:
        reached_at[:] = [s for s in scores if value is s]
        return bool(reached_at)

    factor, ops, reached = scalar_path(logits, at_scores)
    if not reached:
        return None
    for operand in reached_at[0].args:  # the queries or keys scaled before the product
        scalar, _, seen = _operand(operand, inputs)
        factor, ops = factor * scalar, ops + seen
    return factor, ops


def computed(nodes: list[Node], inputs: list[Node], hd: Any) -> list[str]:
    """What attention written out computes, in words, for a refusal that
    cannot take it into the spec (an attention one module down): the scale,
    scores computed in float32 (queries and keys cast before the product),
    a mask selecting the scores with ``torch.where`` (not an attention
    mask the forward is given: its window is not read)."""
    scores, softmax = _score_products(nodes, inputs), _softmaxes(nodes)
    if len(scores) != 1 or not softmax:
        return []
    said = []
    scaled = _scale(scores, softmax[0], inputs)
    if scaled is not None and isinstance(hd, int):
        factor, ops = scaled
        default = " (the kernel's default)" if math.isclose(factor, hd**-0.5, rel_tol=1e-9) else ""
        said.append(f"scores scaled by {factor:g}{default}{': ' + ' '.join(ops) if ops else ' (unscaled)'}")
    else:
        said.append("a scale not traced")
    if all(_cast_to_float32(a) for a in scores[0].args):
        said.append("the scores computed in float32 (queries and keys cast before the product)")
    if WHERE_MASK in _score_masks(softmax[0])[1]:
        said.append(
            "the scores selected by a boolean mask with torch.where (not an attention mask the forward "
            "is given: a causal or sliding-window mask research does not read)"
        )
    return said


def _cast_to_float32(value: Any) -> bool:
    """``value`` is cast to float32 (``.to(torch.float32)``, ``.float()``),
    through shape changes."""
    for _ in range(16):
        if not isinstance(value, Node) or not value.args:
            return False
        if value.kind == "method" and (
            value.name == "float"
            or (
                value.name == "to"
                and any(_is_float32(a) for a in [*value.args[1:], *(v for _, v in value.kwargs)])
            )
        ):
            return True
        if value.kind == "method" and value.name in (*_SHAPES, "to"):
            value = value.args[0]
        else:
            return False
    return False


def _is_float32(value: Any) -> bool:
    return getattr(value, "qualname", None) == "torch.float32"


def _score_products(nodes: list[Node], inputs: list[Node]) -> list[Node]:
    """The products of two tensors both computed from the input projections,
    not from a softmax's output (the scores q @ k^T, not probs @ v)."""
    softmax = _softmaxes(nodes)
    return [
        n
        for n in _products(nodes)
        if all(any(depends_on(a, c) for c in inputs) for a in n.args)
        and not any(depends_on(a, m) for a in n.args for m in softmax)
    ]


def _products(nodes: list[Node]) -> list[Node]:
    """Batched matrix products of two tensors (``matmul``, ``@``, ``bmm``)."""
    return [
        n
        for n in nodes
        if n.kind in ("call", "binop") and n.name.rsplit(".", 1)[-1] in ("matmul", "bmm") and len(n.args) == 2
    ]


def roles(nodes: list[Node], inputs: list[Node]) -> dict[str, Any]:
    """The projection instances giving the queries and the keys (the first
    and second operands of the scores product) and the values (the second
    operand of the product of the softmax's output), each traced through
    reshapes and scalars; empty unless all three are found and distinct."""
    softmax = _softmaxes(nodes)
    scores = _score_products(nodes, inputs)
    weighted = [p for p in _products(nodes) if softmax and depends_on(p.args[0], softmax[0])]
    if len(scores) != 1 or len(weighted) != 1:
        return {}
    found = [_operand(a, inputs)[1] for a in (*scores[0].args, weighted[0].args[1])]
    refs = [f.ref for f in found if f is not None]
    if len(refs) != 3 or len({id(r) for r in refs}) != 3:
        return {}
    return dict(zip(("q_proj", "k_proj", "v_proj"), refs, strict=True))


# methods that change a tensor's shape or layout, not its values
_SHAPES = ("view", "reshape", "transpose", "permute", "contiguous", "unflatten", "flatten")


def _operand(value: Any, inputs: list[Node]) -> tuple[float, Node | None, list[str]]:
    """An operand of a product followed down to the input projection call
    it is, through shape changes, scalar products and quotients and a cache
    update (which returns the keys and values it is given: ``k, v =
    cache.update(k, v, i)``): the scalars met, the call (None where the
    operand is computed otherwise, a rotation for one: the scalars met
    until there) and the operations seen."""
    factor, ops = 1.0, list[str]()
    for _ in range(32):
        value = strip_casts(value)
        if any(value is c for c in inputs):
            return factor, value, ops
        if not isinstance(value, Node) or not value.args:
            break
        if value.kind == "method" and value.name in _SHAPES:
            value = value.args[0]
        elif value.kind == "binop" and value.name in ("mul", "div") and number(value.args[1]):
            op, scalar = ("*", value.args[1]) if value.name == "mul" else ("/", value.args[1])
            factor, ops, value = (
                factor * scalar if op == "*" else factor / scalar,
                [*ops, f"{op} {scalar:g}"],
                value.args[0],
            )
        elif value.kind == "binop" and value.name == "mul" and number(value.args[0]):
            factor, ops, value = factor * value.args[0], [*ops, f"* {value.args[0]:g}"], value.args[1]
        elif value.kind == "item" and len(value.args) == 2 and _cache_update(value.args[0], value.args[1]):
            value = value.args[0].args[1 + value.args[1]]
        else:
            break
    return factor, None, ops


def _cache_update(update: Any, index: Any) -> bool:
    """``update`` is a cache's ``update(keys, values, ...)`` and ``index``
    picks the keys (0) or the values (1) it returns."""
    return (
        isinstance(index, int)
        and index in (0, 1)
        and isinstance(update, Node)
        and update.kind == "method"
        and update.name == "update"
        and len(update.args) > 2
    )


def _softmaxes(nodes: list[Node]) -> list[Node]:
    return [n for n in nodes if n.kind in ("call", "method") and n.name.rsplit(".", 1)[-1] == "softmax"]


def _score_masks(softmax: Node, conditions: list[Any] | None = None) -> tuple[Any, list[str]]:
    """The softmax's input without the tensors the forward is given and adds
    to it as they are (an attention mask), and those parameters' names;
    through reshapes (``view``, ``reshape``: the values unchanged) and a
    clamp to the dtype's minimum (XGLM's ``torch.max(w, full((),
    finfo(dtype).min))``, which changes no value the softmax gives weight);
    the boolean masks that select the scores with ``torch.where`` are
    appended to ``conditions``."""
    value = softmax.args[0] if softmax.args else None
    masks: list[str] = []
    while True:
        value = _reshaped(strip_casts(value))
        if isinstance(value, Node) and value.kind == "binop" and value.name == "add":
            given = [a for a in value.args if isinstance(a, Node) and a.kind == "input"]
            if len(given) != 1:
                break
            masks.append(given[0].name)
            value = next(a for a in value.args if a is not given[0])
        elif _clamped_to_dtype_min(value):
            value = value.args[0]
        elif _filled_with_dtype_min(value):  # GPT-Neo's where(causal_mask, w, finfo(dtype).min)
            masks.append(WHERE_MASK)
            if conditions is not None:
                conditions.append(value.args[0])
            value = value.args[1]
        else:
            break
    return value, masks


# what _score_masks records for a mask selecting the scores with torch.where
WHERE_MASK = "<torch.where mask>"


def _filled_with_dtype_min(value: Any) -> bool:
    """``torch.where(mask, x, torch.tensor(torch.finfo(dtype).min))``: the
    scores where a boolean mask holds, the dtype's minimum elsewhere."""
    if not (isinstance(value, Node) and value.kind == "call" and value.name == "torch.where"):
        return False
    if len(value.args) != 3:
        return False
    fill = value.args[2]
    if isinstance(fill, Node) and fill.kind == "call" and fill.name == "torch.tensor" and fill.args:
        fill = fill.args[0]
    return _dtype_min(fill)


def _dtype_min(fill: Any) -> bool:
    return (
        isinstance(fill, Node)
        and fill.kind == "attr"
        and fill.name == "min"
        and bool(fill.args)
        and isinstance(fill.args[0], Node)
        and fill.args[0].name == "torch.finfo"
    )


def _reshaped(value: Any) -> Any:
    while (
        isinstance(value, Node)
        and value.kind == "method"
        and value.name in ("view", "reshape")
        and value.args
    ):
        value = value.args[0]
    return value


def _clamped_to_dtype_min(value: Any) -> bool:
    """``torch.max(x, torch.full((), torch.finfo(dtype).min))``."""
    if not (
        isinstance(value, Node)
        and value.kind == "call"
        and value.name in ("torch.max", "torch.maximum")
        and len(value.args) == 2
    ):
        return False
    bound = value.args[1]
    fill = (
        bound.value if isinstance(bound, TensorInit) and bound.fill == "full" and bound.shape == () else None
    )
    return _dtype_min(fill)


def window(st: AnalyzerState, index: int, nodes: list[Node]) -> Any:
    """The sliding window of attention written out on layer ``index``: None
    when the scores are masked by what transformers' causal mask builds
    (:func:`layer_inputs.plain_causal_mask`) or selected by a causal mask the
    module computes (GPT-Neo's ``torch.where(bias[..., K - Q:K, :K], w,
    finfo.min)`` with ``bias = tril(ones)``), the window's length when that
    mask keeps a causal band (``tril(ones) ^ tril(ones, -w)``:
    :mod:`band_mask`); unknown otherwise."""
    found = {_window(st, index, softmax) for softmax in _softmaxes(nodes)}  # one per path
    return found.pop() if len(found) == 1 else UNKNOWN


def _window(st: AnalyzerState, index: int, softmax: Node) -> Any:
    conditions: list[Any] = []
    _, masks = _score_masks(softmax, conditions)
    given = [m for m in masks if m != WHERE_MASK]
    read = [band_mask.causal_window(c) for c in conditions]
    if not masks or not all(ok for ok, _ in read) or len(given) > 1:
        return UNKNOWN
    if not all(layer_inputs.plain_causal_mask(st, index, m) for m in given):
        return UNKNOWN
    windows = {w for _, w in read if w is not None}
    if len(windows) > 1:
        return UNKNOWN
    return windows.pop() if windows else None
