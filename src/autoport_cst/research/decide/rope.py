"""The RoPE section of the spec: none when the code applies no rotation;
else the type, theta and scaling parameters from the config, the partial
rotary factor (the code's rotary dimension first), the style and the layers
without RoPE from the code; and the conflict when config and code disagree
on the rotary dimension."""

from __future__ import annotations

import math

from autoport_cst.research.decide.state import Decider
from autoport_cst.research.findings import CODE, CONFIG
from autoport_cst.spec import RopeSpec


def rope(d: Decider) -> RopeSpec:
    code_type = d.code_finding("rope.type")
    if code_type is not None and code_type.known and code_type.value == "none":
        d.decisions.append(code_type)
        return RopeSpec(type="none", theta=None, parameters=None)
    # the code's type only for a base written in the code (a config without RoPE fields)
    in_code = d.flag("rope.theta_in_code", None)
    rope_type = d.decide("rope.type", "default", (CONFIG, CODE) if in_code is not None else (CONFIG,))
    theta = d.value("rope.theta")
    parameters = d.value("rope.parameters")
    factor = d.decide("rope.partial_rotary_factor", 1.0, (CODE, CONFIG))
    style = d.decide("rope.style", "rotate_half", (CODE,))
    nope = d.decide("rope.nope_layers", None, (CODE,))
    return RopeSpec(
        type=rope_type,
        theta=theta,
        theta_in_code=in_code,
        parameters=parameters,
        partial_rotary_factor=float(factor),
        style=style,
        nope_layers=nope,
        nope_rule=d.code_value("rope.nope_rule") if nope else None,
        layer_parameters=d.value("rope.layer_parameters"),
    )


def partial_factor_check(d: Decider) -> None:
    cfg = d.cfg_finding("rope.partial_rotary_factor")
    code = d.code_finding("rope.partial_rotary_factor")
    if (
        cfg is not None
        and code is not None
        and cfg.known
        and code.known
        and not math.isclose(cfg.value, code.value, rel_tol=1e-6)
    ):
        d.conflict(
            "rope.partial_rotary_factor",
            [(CONFIG, cfg.value, cfg.evidence), (CODE, code.value, code.evidence)],
            f"the spec takes {code.value}: the rotary dimension the code builds",
        )
