"""The decoder sections of the spec: the norms (kind, bias, offset,
placement and the epsilon with its config key: the config's value, the
code's key), the residual structure, and the layer counts of the three
sources."""

from __future__ import annotations

from autoport_cst.research.decide.state import Decider
from autoport_cst.research.findings import CHECKPOINT, CODE, CONFIG
from autoport_cst.spec import NormSpec, ResidualSpec


def norm(d: Decider) -> NormSpec:
    return NormSpec(
        kind=d.decide("norm.kind", "rmsnorm"),
        bias=d.decide("norm.bias", False),
        unit_offset=d.decide("norm.unit_offset", False),
        placement=d.decide("norm.placement", "pre"),
        eps_key=_eps_key(d),
        fixed_eps=_fixed_eps(d),
        affine=d.flag("code.norm_affine", True),
        eps=_eps(d),
    )


def residual(d: Decider) -> ResidualSpec:
    return ResidualSpec(
        parallel=d.decide("residual.parallel", "none", (CODE,)),
        multiplier=d.decide("residual.multiplier", None, (CODE,)),
    )


def num_layers_check(d: Decider) -> None:
    """A conflict when config, code and checkpoint count different layers."""
    counts = []
    for source, finding in (
        (CONFIG, d.cfg_finding("num_layers")),
        (CODE, d.code_finding("num_layers")),
        (CHECKPOINT, d.ckpt_finding("num_layers")),
    ):
        if finding is not None and finding.known:
            counts.append((source, finding.value, finding.evidence))
    if len({v for _, v, _ in counts}) > 1:
        d.conflict("num_layers", counts, "the spec takes the config value")


def _eps(d: Decider) -> float | None:
    fixed = _fixed_eps(d)
    if fixed is not None:
        return fixed
    value = d.value("norm.eps")
    return value if value is not None else d.code_value("norm.eps")


def _fixed_eps(d: Decider) -> float | None:
    """The epsilon the code fixes (no config field read); a config.json
    epsilon of another value is a conflict the code wins: transformers
    ignores that field."""
    code = d.code_finding("norm.fixed_eps")
    if code is None or not code.known:
        return None
    cfg = d.cfg_finding("norm.eps")
    if cfg is not None and cfg.known and cfg.value != code.value and code not in d.decisions:
        d.conflict(
            "norm.eps",
            [(CONFIG, cfg.value, cfg.evidence), (CODE, code.value, code.evidence)],
            f"the spec takes {code.value:g}: the code does not read the config's epsilon",
            "warning",
        )
    if code not in d.decisions:
        d.decisions.append(code)
    return float(code.value)


def _eps_key(d: Decider) -> str:
    code = d.code_finding("norm.eps_key")
    cfg = d.cfg_finding("norm.eps_key")
    if code is not None and code.known:
        if cfg is not None and cfg.known and cfg.value != code.value:
            d.conflict(
                "norm.eps_key",
                [(CONFIG, cfg.value, cfg.evidence), (CODE, code.value, code.evidence)],
                f"the spec takes {code.value!r}: the code reads that key",
                "warning",
            )
        d.decisions.append(code)
        return code.value
    fixed = d.code_finding("norm.fixed_eps")
    if fixed is not None and fixed.known:
        # no config field is read: the key is the config's (or the default) and the port does not use it
        return cfg.value if cfg is not None and cfg.known else "rms_norm_eps"
    return d.decide("norm.eps_key", "rms_norm_eps", (CONFIG,))
