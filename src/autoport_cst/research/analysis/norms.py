"""What a norm's forward computes, by its arithmetic: a call of
``F.layer_norm`` / ``F.rms_norm``, or written out: mean subtraction and a
root (LayerNorm), a root mean square only (RMSNorm); then the parameters
applied to the normalised value (weight, ``1 + weight``, an additive bias).
Never by the class name. Shared by the role classification of every module
(a module is a norm when this recognises it) and the decoder section."""

from __future__ import annotations

from typing import Any

from autoport_cst.research.analysis.graph import is_one, is_square, number, param_inside, strip_casts
from autoport_cst.research.interp.values import Instance, Node, Param
from autoport_cst.research.interp.walk import depends_on, walk


def classify_norm_graph(instance: Instance, value: Any) -> dict[str, Any]:
    """kind (layernorm, rmsnorm or None), bias, unit_offset, affine and the
    evidence, for one forward output ``value`` of the norm ``instance``."""
    info: dict[str, Any] = {"kind": None, "bias": None, "unit_offset": None, "affine": True, "evidence": ""}
    nodes = list(walk(value))
    inputs = [n for n in nodes if n.kind == "input"]
    if not inputs:
        return info
    for n in nodes:
        short = n.name.rsplit(".", 1)[-1]
        if n.kind == "call" and short in ("layer_norm", "rms_norm"):
            return _functional_norm(n, short, info)
    if not _written_out_kind(nodes, inputs, info):
        return info
    return _weight_and_bias(instance, nodes, inputs, info)


def _param_of(v: Any) -> Param | None:
    v = strip_casts(v)
    if isinstance(v, Node) and v.kind == "param" and isinstance(v.ref, Param):
        return v.ref
    return None


def _functional_norm(n: Node, short: str, info: dict[str, Any]) -> dict[str, Any]:
    """``F.layer_norm(x, shape, weight, bias, eps)`` / ``F.rms_norm(...)``."""
    weight = n.args[2] if len(n.args) > 2 else n.kwarg("weight")
    bias = n.args[3] if len(n.args) > 3 else n.kwarg("bias")
    info["kind"] = "layernorm" if short == "layer_norm" else "rmsnorm"
    eps = n.args[4] if len(n.args) > 4 else n.kwarg("eps")
    if number(eps):
        info["eps_constant"] = float(eps)
    info["bias"] = _param_of(bias) is not None
    # the weight argument may be the parameter plus one (Nemotron's LayerNorm1P)
    offset = strip_casts(weight)
    info["unit_offset"] = bool(
        isinstance(offset, Node)
        and offset.kind == "binop"
        and offset.name == "add"
        and any(is_one(a) and param_inside(b) for a, b in (offset.args, offset.args[::-1]))
    )
    info["affine"] = _param_of(weight) is not None or info["unit_offset"]
    shown = "1 + param" if info["unit_offset"] else "param" if info["affine"] else repr(weight)
    info["evidence"] = f"calls {n.name}(weight={shown}, bias={'param' if info['bias'] else 'none'})"
    return info


def _written_out_kind(nodes: list[Node], inputs: list[Node], info: dict[str, Any]) -> bool:
    """LayerNorm (mean subtracted, or a variance, and a root) or RMSNorm
    (mean of squares and a root, no subtraction) written out; sets the kind
    and evidence in ``info``. False when it is neither."""
    means = [
        n
        for n in nodes
        if (n.kind == "method" and n.name == "mean") or (n.kind == "call" and n.name.endswith(".mean"))
    ]
    variances = [n for n in nodes if n.kind in ("method", "call") and n.name.rsplit(".", 1)[-1] == "var"]
    squares = set()
    for m in means:
        operand = strip_casts(m.args[0]) if m.args else None
        if is_square(operand):
            squares.add(id(m))
    plain_means = [m for m in means if id(m) not in squares]
    subtracted = any(
        n.kind == "binop"
        and n.name == "sub"
        and any(depends_on(n.args[1], m) for m in plain_means)
        and depends_on(n.args[0], inputs[0])
        for n in nodes
    )
    root = any(_is_root(n) for n in nodes)
    if (subtracted or variances) and root:
        info["kind"] = "layernorm"
        info["evidence"] = "subtracts the mean, divides by the standard deviation"
    elif squares and root and not subtracted:
        info["kind"] = "rmsnorm"
        info["evidence"] = "divides by the root mean square, no mean subtraction"
    else:
        return False
    return True


def _is_root(n: Node) -> bool:
    """A square root or its inverse: ``sqrt``, ``rsqrt``, or a power of
    0.5 or -0.5 (``torch.pow(x, -0.5)``, ``x.pow(-0.5)``, ``x ** -0.5``)."""
    short = n.name.rsplit(".", 1)[-1]
    if n.kind in ("call", "method") and short in ("rsqrt", "sqrt"):
        return True
    power = n.kind in ("call", "method") and short == "pow" or n.kind == "binop" and n.name == "pow"
    exponent = n.args[1] if len(n.args) > 1 else n.kwarg("exponent")
    return bool(power and number(exponent) and exponent in (0.5, -0.5))


def _weight_and_bias(
    instance: Instance, nodes: list[Node], inputs: list[Node], info: dict[str, Any]
) -> dict[str, Any]:
    """Parameters multiplied with / added to the normalised value."""
    params = {id(p): p for p in instance.attrs.values() if isinstance(p, Param)}
    info["unit_offset"] = False
    info["bias"] = False
    weight_used = False
    for n in nodes:
        if n.kind == "binop" and n.name == "add":
            a, b = n.args
            pa, pb = _param_of(a), _param_of(b)
            if (is_one(a) and param_inside(b)) or (is_one(b) and param_inside(a)):
                info["unit_offset"] = True
            elif (pa is not None and depends_on(b, inputs[0])) or (
                pb is not None and depends_on(a, inputs[0])
            ):
                info["bias"] = True
        if n.kind == "binop" and n.name == "mul" and any(param_inside(x) for x in n.args):
            weight_used = True
    info["affine"] = weight_used or bool(params)
    extras = []
    if info["unit_offset"]:
        extras.append("weight applied as (1 + weight)")
    if info["bias"]:
        extras.append("adds a bias")
    if extras:
        info["evidence"] += "; " + ", ".join(extras)
    return info
