"""Attention temperature: queries multiplied, between their projection and
the attention, by a value that grows with the token's position.

Ministral 3 and Llama 4 scale the rotated queries by
``1 + beta * log(1 + floor((position + offset) / floor_scale))`` (Ministral 3:
``torch.log(1 + torch.floor(position_ids / n))`` in a helper function, beta
and n from ``config.rope_parameters``; Llama 4: ``torch.log1p(torch.floor(
(positions + 1.0) / self.floor_scale)) * self.attn_scale + 1.0`` inline, on
its layers without RoPE, the positions counted from the cache's length).

:func:`scale_of` finds such a factor in a traced attention and
:func:`read_formula` reads its constants (a helper function of the source is
followed), which :func:`findings` turns into ``attention.temperature_*``
findings with the config fields that hold them. A factor of another form,
or constants no single config field holds, stays refused
(``unsupported.position_scaled_attention``), as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from autoport_cst.research.analysis.graph import number
from autoport_cst.research.analysis.state import AnalyzerState
from autoport_cst.research.findings import CODE, known
from autoport_cst.research.interp.config_proxy import ConfigProxy
from autoport_cst.research.interp.values import FuncRef, Instance, Node, merge_returns

# ops that only reshape, broadcast or cast the factor
_SHAPE_OPS = {"to", "view", "expand", "reshape", "unsqueeze", "type_as", "float", "contiguous"}


# config fields only training or initialisation reads: never a constant of inference
_TRAINING_ONLY = frozenset(
    {
        "initializer_range",
        "attention_dropout",
        "hidden_dropout",
        "router_aux_loss_coef",
        "router_jitter_noise",
    }
)


@dataclass(frozen=True)
class Formula:
    """``1 + beta * log(1 + floor((position + offset) / floor_scale))``;
    ``rounded``: the factor is cast to the queries' dtype before it
    multiplies them (Ministral 3), else the product is (Llama 4)."""

    beta: float
    floor_scale: float
    offset: float
    rounded: bool


@dataclass(frozen=True)
class Scaling:
    """Queries or keys multiplied (``mul``) or divided (``div``) by
    ``factor``, computed from the forward's inputs ``inputs``."""

    op: str
    factor: Any
    inputs: tuple[str, ...]


def _strip(st: AnalyzerState, value: Any) -> tuple[Any, bool]:
    """``value`` without reshapes and casts (a helper function of the source
    followed into its body); True when a ``.to(...)`` cast was stripped."""
    cast = False
    for _ in range(32):
        if isinstance(value, Node) and value.kind == "method" and value.name in _SHAPE_OPS and value.args:
            cast = cast or value.name in ("to", "type_as")
            value = value.args[0]
        elif isinstance(value, Node) and value.kind == "item" and value.args:
            value = value.args[0]  # x[:, None, :, None]
        elif isinstance(value, Node) and value.kind == "func" and isinstance(value.ref, FuncRef):
            states = st.interp.call_function(
                value.ref.module, value.ref.node, list(value.args), dict(value.kwargs)
            )
            value = merge_returns(states)
        else:
            break
    return value, cast


def _binop(value: Any, name: str) -> tuple[Any, Any] | None:
    if isinstance(value, Node) and value.kind == "binop" and value.name == name and len(value.args) == 2:
        return value.args[0], value.args[1]
    return None


def _number_and_other(pair: tuple[Any, Any] | None) -> tuple[float, Any] | None:
    """(the number, the other operand) of a commutative operation with one number."""
    if pair is None:
        return None
    left, right = pair
    if number(left) and not number(right):
        return float(left), right
    if number(right) and not number(left):
        return float(right), left
    return None


def _call(value: Any, name: str) -> Any:
    if isinstance(value, Node) and value.kind == "call" and value.name == name and len(value.args) == 1:
        return value.args[0]
    return None


def read_formula(st: AnalyzerState, factor: Any) -> Formula | None:
    """The constants of ``factor`` when it is
    ``1 + beta * log(1 + floor((position + offset) / floor_scale))``."""
    body, cast = _strip(st, factor)
    one_plus = _number_and_other(_binop(body, "add"))
    if one_plus is None or one_plus[0] != 1.0:
        return None
    times = _number_and_other(_binop(_strip(st, one_plus[1])[0], "mul"))
    if times is None:
        return None
    beta, logarithm = times
    logarithm = _strip(st, logarithm)[0]
    floored = _call(logarithm, "torch.log1p")
    if floored is None:
        inner = _number_and_other(_binop(_call(logarithm, "torch.log"), "add"))
        if inner is None or inner[0] != 1.0:
            return None
        floored = inner[1]
    quotient = _binop(_call(_strip(st, floored)[0], "torch.floor"), "div")
    if quotient is None or not number(quotient[1]) or number(quotient[0]):
        return None
    position, floor_scale = _strip(st, quotient[0])[0], float(quotient[1])
    shifted = _number_and_other(_binop(position, "add"))
    offset = shifted[0] if shifted is not None else 0.0
    return Formula(beta=beta, floor_scale=floor_scale, offset=offset, rounded=cast)


def config_field(st: AnalyzerState, attn: Instance, value: float) -> str | None:
    """The config field holding ``value``: the one an attribute of the
    attention equal to it was read from, else the only field of the config
    (or of its ``rope_parameters``, as ``rope_parameters.<key>``) equal to
    it; None when none or several are."""
    for attr, keys in attn.attr_reads.items():
        held = attn.attrs.get(attr)
        if number(held) and float(held) == value and len(keys) == 1:
            return next(iter(keys))
    config = st.interp.config
    found = []
    for name, held in _fields(config):
        if number(held) and float(held) == value:
            found.append(name)
    return found[0] if len(found) == 1 else None


def _fields(config: ConfigProxy) -> list[tuple[str, Any]]:
    raw = config._config  # the configuration object the interpreter reads
    values = raw if isinstance(raw, dict) else (raw.to_dict() if hasattr(raw, "to_dict") else vars(raw))
    out = [(k, v) for k, v in values.items() if not isinstance(v, dict) and k not in _TRAINING_ONLY]
    rope = values.get("rope_parameters")
    if isinstance(rope, dict):
        out += [(f"rope_parameters.{k}", v) for k, v in rope.items()]
    return out


def findings(st: AnalyzerState, attn: Instance, scaled: list[bool], formula: Formula, where: str) -> bool:
    """The ``attention.temperature_*`` findings of ``formula`` found on the
    layers ``scaled`` marks (every layer, or exactly those without RoPE);
    False when its constants or layers are not read (then refused)."""
    beta_key = config_field(st, attn, formula.beta)
    floor_key = config_field(st, attn, formula.floor_scale)
    rotated = st.layer_rotation
    if all(scaled):
        layers = "all"
    elif len(rotated) == len(scaled) and scaled == [not r for r in rotated]:
        layers = "nope"
    else:
        return False
    if beta_key is None or floor_key is None:
        return False
    evidence = (
        f"{where}: queries multiplied by 1 + {beta_key} * log(1 + floor((position + {formula.offset:g}) "
        f"/ {floor_key})) (beta {formula.beta:g}, floor {formula.floor_scale:g}) on "
        + ("every layer" if layers == "all" else "the layers without RoPE")
    )
    st.add(known(beta_key, "attention.temperature_beta_key", CODE, evidence))
    st.add(known(floor_key, "attention.temperature_floor_key", CODE, evidence))
    st.add(known(formula.offset, "attention.temperature_offset", CODE, evidence))
    st.add(known(layers, "attention.temperature_layers", CODE, evidence))
    st.add(known(formula.rounded, "attention.temperature_rounded", CODE, evidence))
    return True


def refuse_or_read(st: AnalyzerState, found: list[tuple[Instance, Scaling | None]]) -> None:
    """An attention temperature (``found``: per traced layer) read as
    ``attention.temperature_*``: one formula multiplying the queries, on
    every layer or on those without RoPE; anything else refused
    (``unsupported.position_scaled_attention``)."""
    scaled = [(attn, s) for attn, s in found if s is not None]
    if not scaled:
        return
    attn, first = scaled[0]
    where = st.where(attn)
    formulas = {read_formula(st, s.factor) if s.op == "mul" else None for _, s in scaled}
    formula = next(iter(formulas))
    if len(formulas) == 1 and formula is not None:
        if findings(st, attn, [s is not None for _, s in found], formula, where):
            return
    verb = "multiplied" if first.op == "mul" else "divided"
    st.add(
        known(
            True,
            "unsupported.position_scaled_attention",
            CODE,
            f"{where}: the queries or keys are {verb} by a value computed from {', '.join(first.inputs)} "
            "before the attention (a scale that varies with the position: attention temperature)",
        )
    )
