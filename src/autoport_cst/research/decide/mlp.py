"""The MLP section of the spec: kind, activation, bias and the clamped
SwiGLU from the code; the intermediate size (the code's width, else the
config's for a dense model); and the note when the code applies an
activation without reading the config's."""

from __future__ import annotations

from autoport_cst.research.decide.state import Decider
from autoport_cst.research.findings import CODE, known
from autoport_cst.spec import MLPSpec


def mlp(d: Decider, is_moe: bool) -> MLPSpec:
    return MLPSpec(
        kind=d.decide("mlp.kind", "gated", (CODE,)),
        activation=d.decide("mlp.activation", "silu", (CODE,)),
        bias=d.decide("mlp.bias", False, (CODE,)),
        intermediate_size=_intermediate(d, is_moe),
        glu=d.flag("mlp.glu", "standard"),
        glu_alpha=d.flag("mlp.glu_alpha", None),
        glu_limit=d.flag("mlp.glu_limit", None),
    )


def activation_check(d: Decider) -> None:
    """A note when the code applies a fixed activation, not the config's."""
    act = d.cfg_finding("config.activation")
    key = d.code_finding("code.activation_key")
    if act is not None and act.known and d.code is not None:
        code_act = d.code_finding("mlp.activation")
        if key is None and code_act is not None and code_act.known:
            d.notes.append(
                known(
                    code_act.value,
                    "code.activation_fixed",
                    CODE,
                    f"the code does not read {act.evidence}; it applies {code_act.value}",
                )
            )


def _intermediate(d: Decider, is_moe: bool) -> int | None:
    code = d.code_finding("mlp.intermediate_size")
    if code is not None and code.known:
        d.decisions.append(code)
        return code.value
    if is_moe:
        return None
    return d.value("mlp.intermediate_size")
