"""What a router does to the weights of the k experts it chose, read from the
values its forward computes after the top-k:

- renormalised or not: divided by their sum (``w / w.sum()``,
  ``w / torch.sum(w)``), a softmax over the k values, or the same softmax
  written in log space (``torch.exp(x - torch.logsumexp(x))``);
- over what: the k chosen values alone, or together with values the top-k
  did not choose (Inkling: the shared experts' router logits concatenated to
  the k chosen ones, normalised together, then cut off again), whose k
  weights do not sum to 1 and which no spec field describes;
- scaled: by a constant (``routed_scaling_factor``) and/or by a learned
  parameter (Inkling's ``global_scale``), which no spec field describes.

Nothing here knows about a model; the MoE section (:mod:`.moe`) turns these
into findings."""

from __future__ import annotations

import math
from typing import Any

from autoport_cst.research.analysis.graph import number, strip_casts
from autoport_cst.research.interp.values import Node
from autoport_cst.research.interp.walk import depends_on, walk


def _short(node: Node) -> str:
    return node.name.rsplit(".", 1)[-1]


def normalised_operands(nodes: list[Node], topk: Node) -> list[tuple[str, Any]]:
    """Each normalisation of values computed from the top-k: (its form, the
    values it normalises)."""
    found: list[tuple[str, Any]] = []
    for n in nodes:
        if n.kind == "binop" and n.name == "div" and depends_on(n.args[0], topk):
            if any(m.kind in ("call", "method") and _short(m) == "sum" for m in walk(n.args[1])):
                found.append(("divided by their sum", n.args[0]))
        elif n.kind == "call" and n.name.endswith(".exp") and n.args:
            operand = _log_softmax_operand(n.args[0])
            if operand is not None and depends_on(operand, topk):
                found.append(("exp(x - logsumexp(x)): a softmax in log space", operand))
    return found


def _log_softmax_operand(value: Any) -> Any:
    """``x`` of ``x - logsumexp(x)`` (casts aside), else None."""
    value = strip_casts(value)
    if not (isinstance(value, Node) and value.kind == "binop" and value.name == "sub"):
        return None
    x, total = (strip_casts(a) for a in value.args)
    if not (isinstance(total, Node) and total.kind in ("call", "method") and _short(total) == "logsumexp"):
        return None
    if not total.args:
        return None
    return x if strip_casts(total.args[0]) is x or (total.kind == "method" and total.args[0] is x) else None


def unchosen_parts(operand: Any, topk: Node) -> list[Any]:
    """Values concatenated to the chosen ones before they are normalised
    (``torch.cat([chosen, other])``) that the top-k did not choose."""
    parts: list[Any] = []
    for n in walk(operand):
        if n.kind != "call" or _short(n) != "cat" or not n.args:
            continue
        pieces = n.args[0] if isinstance(n.args[0], (list, tuple)) else ()
        chosen = [p for p in pieces if depends_on(p, topk)]
        others = [p for p in pieces if not depends_on(p, topk)]
        if chosen and others:
            parts.extend(others)
    return parts


def renormalisation(nodes: list[Node], topk: Node) -> tuple[bool | None, str] | None:
    """(whether the k weights are renormalised to sum to 1, evidence) when a
    normalisation of values computed from the top-k is found: None for the
    first when they are normalised together with values the top-k did not
    choose (their sum is not 1); None when no normalisation is found."""
    operands = normalised_operands(nodes, topk)
    if not operands:
        return None
    for form, operand in operands:
        others = unchosen_parts(operand, topk)
        if others:
            return None, (
                f"top-k weights normalised ({form}) together with {len(others)} tensor(s) of values "
                "the top-k did not choose (torch.cat before the normalisation): the k weights do not sum to 1"
            )
    return True, f"top-k weights {operands[0][0]}"


def learned_scale(nodes: list[Node], topk: Node) -> str | None:
    """The parameter the chosen experts' weights are multiplied by, if any
    (a learned scale: no spec field describes it)."""
    for n in nodes:
        if n.kind != "binop" or n.name != "mul" or len(n.args) != 2:
            continue
        for x, y in (n.args, n.args[::-1]):
            y = strip_casts(y)
            if isinstance(y, Node) and y.kind == "param" and depends_on(x, topk) and not depends_on(y, topk):
                return f"top-k weights multiplied by the learned parameter {y.name}"
    return None


def routed_scaling(nodes: list[Any], topk: Node) -> dict[str, Any]:
    """A constant the chosen experts' weights are multiplied by; unknown
    (``routed_scaling_learned``) when a learned parameter scales them too."""
    learned = learned_scale(nodes, topk)
    constant = _constant_scaling(nodes, topk)
    if learned is not None:
        return {
            "routed_scaling": None,
            "routed_scaling_learned": True,
            "routed_scaling_evidence": f"{constant['routed_scaling_evidence']}, and {learned}",
        }
    return constant


def _constant_scaling(nodes: list[Any], topk: Node) -> dict[str, Any]:
    for n in nodes:
        if n.kind != "binop" or n.name != "mul":
            continue
        for x, y in (n.args, tuple(reversed(n.args))):
            if number(y) and isinstance(x, Node) and depends_on(x, topk):
                if math.isclose(float(y), 1.0):
                    return {
                        "routed_scaling": None,
                        "routed_scaling_evidence": "top-k weights multiplied by 1.0 (no scaling)",
                    }
                return {
                    "routed_scaling": float(y),
                    "routed_scaling_evidence": f"top-k weights multiplied by {float(y):g}",
                }
    return {"routed_scaling": None, "routed_scaling_evidence": "top-k weights not scaled by a constant"}
