"""One validation run of a port (a TP size, a dtype, the planned config or a
variant of it) and what it reads off the validation report: where the port
first diverges and its largest logit error. Shared by ``port`` and
``port_variants``."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ValidationRun:
    tp: int
    dtype: str
    equivalent: bool
    summary: str
    first_diverging: str | None
    max_abs_error: float | None
    seconds: float
    config: str = "planned"  # or "variant: <field>=<value>, ...": a config the plan was not made on


def first_diverging(report) -> str | None:
    """The first diverging component (with its phase), or the stage that failed."""
    data = report.to_dict()
    diverging = data.get("first_diverging")
    if diverging:
        phase = f" ({diverging['phase']})" if diverging.get("phase") else ""
        return f"{diverging['component']}{phase}"
    failure = data.get("failure")
    if failure:
        return f"failure: {failure.get('stage', '?')}"
    return None


def max_abs(report) -> float | None:
    """The largest absolute logit error of the report, when it has logits."""
    logits = report.to_dict().get("logits") or {}
    value = logits.get("max_abs_error")
    return float(value) if isinstance(value, (int, float)) else None
