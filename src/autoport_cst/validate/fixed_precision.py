"""The verdict of a float32 run in which the port computes part of the model
in a narrower dtype by its own kernel call.

A kernel can be asked for a compute dtype below the model's: the real
vllm_neuron qwen3_moe passes ``compute_dtype=nl.bfloat16`` to ``NF.moe_cte``,
so its prefill experts compute in bf16 on the device whatever the model's
dtype, and so does the stand-in (``standin/precision_notes`` records each such
call with the modules on the stack). Such a port cannot pass float32's
tolerances from that component on, however right it is.

When a float32 run fails and its first diverging component, or a component
before it in data-flow order, holds such a call, the run is judged again by
the bf16 run's gates (``compare.compare_bf16_baselines``: the port's error
against transformers' float32 run must stay within what bf16 transformers
makes of it). The components before the first divergence stay checked at
float32's tolerances (they passed them); ``report.precision`` says which
kernel, where, what float32 found and what the bf16 gates found. A wrong
component still fails: the bf16 gates are those every bf16 validation holds
a port to. A run with no such call is never judged this way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from . import compare
from .driver import PortOutput
from .report import ValidationReport


def fixed_precision_verdict(
    report: ValidationReport,
    port: PortOutput,
    references: dict[str, Any],
    kernel_precision: Callable[[], Any],
    scenario: Any,
    teacher: list[list[int]],
    dtype: str,
) -> None:
    """Judge a failed float32 ``report`` by the bf16 gates when a narrowed
    kernel call lies in or before its first diverging component."""
    if dtype != "fp32" or report.equivalent or report.first_diverging is None or not port.narrowed:
        return
    first = report.first_diverging
    narrowed = _narrowed_up_to(port, first.component)
    if not narrowed:
        return
    report.precision = {
        "narrowed": narrowed,
        "fp32": {"first_diverging": first.message, "failed_checks": list(report.failed_checks)},
    }
    bf16 = references.get("bf16")
    if bf16 is None:
        report.precision["bf16_gates"] = {"unavailable": "no bf16 transformers run"}
        return
    result, baseline = compare.compare_bf16_baselines(
        port, references["fp32"], bf16, kernel_precision, scenario, teacher
    )
    report.precision["bf16_gates"] = {"equivalent": result.equivalent, "failed_checks": result.failed}
    if result.equivalent:
        report.precision["bf16_gates"]["baseline"] = baseline["used"]
        report.take_comparison(result)


def _narrowed_up_to(port: PortOutput, component: str) -> list[dict[str, Any]]:
    """The narrowed calls made within ``component`` or a component before it."""
    names = [c.name for c in port.components]
    end = names.index(component) + 1 if component in names else len(names)
    paths = [c.module_path for c in port.components[:end]]
    return [
        entry
        for entry in port.narrowed
        if any(_within(module, path) for module in entry["modules"] for path in paths)
    ]


def _within(module: str, path: str) -> bool:
    return module == path or module.startswith(path + ".")
