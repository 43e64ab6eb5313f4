"""The verdict of a bf16 MoE port whose free-routing comparison failed: the
teacher-forced routing comparison (``forced_routing``; docs/validation.md, "MoE
routing near-ties") validates it when it passes every gate and every routing
divergence is a near tie; the evidence is recorded in ``report.routing``."""

from __future__ import annotations

import time
from typing import Any

from .driver import PortFailure
from .forced_routing import teacher_forced
from .report import ValidationReport


def forced_routing_verdict(
    report: ValidationReport,
    port_run: Any,
    experts: int | None,
    teacher: list[list[int]],
    timings: dict[str, float],
) -> None:
    """``port_run``: the validation's ``_PortRun`` (its run options, scenario and
    layout, callable with a forced teacher, and its ``reference``)."""
    if port_run.run.dtype != "bf16" or report.equivalent or experts is None:
        return
    start = time.perf_counter()
    try:
        _forced_evidence(report, port_run, teacher, experts)
    finally:
        timings["teacher_forced_routing"] = time.perf_counter() - start


def _forced_evidence(report: ValidationReport, port_run: Any, teacher: list[list[int]], experts: int) -> None:
    if port_run.layout.disaggregated:
        report.routing = {"teacher_forced": {"unavailable": "not run with data or context parallelism"}}
        return
    try:
        evidence = teacher_forced(
            port_run, port_run.reference(teacher, experts), port_run.scenario, teacher, experts
        )
    except PortFailure as failure:
        report.routing = {"teacher_forced": {"unavailable": f"the forced port run failed: {failure.message}"}}
        return
    report.routing = evidence.describe(report.failed_checks)
    report.routing["summary"] = evidence.summary()
    if evidence.validates and evidence.comparison is not None:
        report.take_comparison(evidence.comparison)
