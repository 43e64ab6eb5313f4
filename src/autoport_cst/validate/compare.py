"""Align the port's outputs with the transformers outputs position by
position and turn the metrics into a verdict.

Row alignment: the prefill of sequence ``b`` (prompt length ``T_b``) covers
the positions its calls computed, ``start_b..T_b-1`` (``start_b`` > 0 for a
prefix-cache hit, whose cached tokens are not recomputed); its logits only
the positions each call sampled (``PrefillCall.sampled_positions``: every
position, or the last, as the runner samples); decode step ``j`` covers
position ``T_b + j`` of every sequence. Transformers ran each full
sequence in one forward, so its row for a position is simply that position.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from . import metrics as M
from .driver import PortOutput
from .kernel_precision import POLICY
from .reference import ReferenceOutput
from .report import Divergence
from .scenario import Scenario

PHASES = ("prefill", "decode")


def _port_rows(records: dict[str, list[torch.Tensor]], name: str) -> list[torch.Tensor] | None:
    rows = records.get(name)
    return rows if rows else None


def prefill_spans(port: PortOutput, scenario: Scenario) -> dict[int, tuple[int, int]]:
    """For each sequence the port ran, the positions ``[start, end)`` its
    prefill computed."""
    if port.sequences:
        return dict(zip(port.sequences, port.prefill_spans, strict=False))
    return {b: (0, len(p)) for b, p in enumerate(scenario.prompts)}


def sampled_positions(port: PortOutput, scenario: Scenario) -> list[tuple[int, tuple[int, ...]]]:
    """Per prefill call, in order: its sequence and the positions whose
    logits it returned (its sampling positions)."""
    if port.prefill_calls:
        return [(call.sequence, call.sampled_positions) for call in port.prefill_calls]
    return [(b, tuple(range(start, end))) for b, (start, end) in prefill_spans(port, scenario).items()]


def _ref_logits(
    reference: list[torch.Tensor], scenario: Scenario, phase: str, port: PortOutput
) -> torch.Tensor:
    """The reference logits matching the port's: the sampled positions of
    each prefill call, or every sequence's row of each decode step."""
    if phase == "decode":
        return _ref_rows(reference, scenario, phase, prefill_spans(port, scenario))
    return torch.cat([reference[b][list(positions)] for b, positions in sampled_positions(port, scenario)])


def _ref_rows(
    reference: list[torch.Tensor],
    scenario: Scenario,
    phase: str,
    spans: dict[int, tuple[int, int]] | None = None,
) -> torch.Tensor:
    """The reference rows matching the port's: by default every prompt of the
    scenario, prefilled whole."""
    if spans is None:
        spans = {b: (0, len(p)) for b, p in enumerate(scenario.prompts)}
    if phase == "prefill":
        return torch.cat([reference[b][start:end] for b, (start, end) in spans.items()])
    return torch.cat(
        [
            torch.stack([reference[b][len(scenario.prompts[b]) + step] for b in spans])
            for step in range(scenario.steps)
        ]
    )


def compare_components(
    port: PortOutput,
    ref32: ReferenceOutput,
    ref16: ReferenceOutput | None,
    scenario: Scenario,
    dtype: str,
) -> tuple[list[M.ComponentMetrics], list[str]]:
    """Metrics per component and phase, in data-flow order, plus the names
    found on only one side."""
    port_names = [c.name for c in port.components]
    ref_names = [c.name for c in ref32.components]
    modules = {c.name: c.module_path for c in port.components}
    spans = prefill_spans(port, scenario)
    results: list[M.ComponentMetrics] = []
    for name in ref_names:
        if name not in port_names:
            continue
        for phase in PHASES:
            if phase == "prefill" and name == "embedding" and scenario.prompt_embeds is not None:
                continue  # the module's rows at embedded positions are replaced after it
            records = port.prefill_records if phase == "prefill" else port.decode_records
            rows = _port_rows(records, name)
            if rows is None:
                continue
            target = torch.cat(rows)
            f = _ref_rows(ref32.records[name], scenario, phase, spans)
            b = _ref_rows(ref16.records[name], scenario, phase, spans) if ref16 else None
            results.append(M.component_metrics(name, phase, modules[name], target, f, b, dtype))
    # logits, the model output
    for phase in PHASES:
        target = torch.cat(port.prefill_logits if phase == "prefill" else port.decode_logits)
        f = _ref_logits(ref32.logits, scenario, phase, port)
        b = _ref_logits(ref16.logits, scenario, phase, port) if ref16 else None
        results.append(M.component_metrics("logits", phase, "<output>", target, f, b, dtype))
    not_compared = sorted(
        [f"{n} (port only)" for n in port_names if n not in ref_names]
        + [f"{n} (transformers only)" for n in ref_names if n not in port_names]
    )
    return results, not_compared


def compare_logits(
    port: PortOutput,
    ref32: ReferenceOutput,
    ref16: ReferenceOutput | None,
    scenario: Scenario,
    teacher: list[list[int]],
    dtype: str,
) -> M.LogitMetrics:
    target = torch.cat(port.prefill_logits + port.decode_logits)
    spans = prefill_spans(port, scenario)
    f = torch.cat([_ref_logits(ref32.logits, scenario, phase, port) for phase in PHASES])
    b = torch.cat([_ref_logits(ref16.logits, scenario, phase, port) for phase in PHASES]) if ref16 else None
    expected = f if dtype == "fp32" or b is None else b
    positions = [("prefill", seq, p) for seq, sampled in sampled_positions(port, scenario) for p in sampled]
    row_of = {(seq, p): row for row, (_phase, seq, p) in enumerate(positions)}
    prefill_total = len(positions)
    for step in range(scenario.steps):
        positions += [("decode", seq, len(scenario.prompts[seq]) + step) for seq in spans]
    greedy_rows: list[list[int]] = []
    greedy_tokens: list[list[int]] = []
    batch = len(spans)
    for index, seq in enumerate(spans):
        prompt = scenario.prompts[seq]
        last_prompt_row = row_of[(seq, len(prompt) - 1)]
        rows = [last_prompt_row] + [prefill_total + step * batch + index for step in range(scenario.steps)]
        last = int(torch.argmax(ref32.logits[seq][len(prompt) + scenario.steps - 1]))
        greedy_rows.append(rows)
        greedy_tokens.append(list(teacher[seq]) + [last])
    return M.logit_metrics(target, expected, f, b, positions, greedy_rows, greedy_tokens, dtype)


@dataclass
class Comparison:
    """The port against one pair of baselines (fp32, and bf16 or none)."""

    components: list[M.ComponentMetrics]
    not_compared: list[str]
    logits: M.LogitMetrics
    equivalent: bool
    first: Divergence | None
    failed: list[str]


def compare_all(
    port: PortOutput,
    ref32: ReferenceOutput,
    ref16: ReferenceOutput | None,
    scenario: Scenario,
    teacher: list[list[int]],
    dtype: str,
) -> Comparison:
    components, not_compared = compare_components(port, ref32, ref16, scenario, dtype)
    logits = compare_logits(port, ref32, ref16, scenario, teacher, dtype)
    equivalent, first, failed = verdict(components, logits)
    return Comparison(components, not_compared, logits, equivalent, first, failed)


def compare_bf16_baselines(
    port: PortOutput,
    ref32: ReferenceOutput,
    eager: ReferenceOutput,
    kernel_precision: Callable[[], ReferenceOutput | str],
    scenario: Scenario,
    teacher: list[list[int]],
) -> tuple[Comparison, dict]:
    """A bf16 port against transformers' eager bf16 run and, only when it
    fails there, against transformers at the kernels' precision policy
    (``kernel_precision()`` runs it, or returns why it cannot). Every gate is
    the same against either baseline; the port validates when it passes
    every gate against one of them. Returns the comparison reported (the
    policy's when that passes, else the eager one) and which baseline was
    used, with the other's failed checks."""
    eager_result = compare_all(port, ref32, eager, scenario, teacher, "bf16")
    if eager_result.equivalent:
        return eager_result, {"used": "eager"}
    policy = kernel_precision()
    if isinstance(policy, str):
        return eager_result, {"used": "eager", "kernel_precision": {"unavailable": policy}}
    policy_result = compare_all(port, ref32, policy, scenario, teacher, "bf16")
    if policy_result.equivalent:
        used = {"used": "kernel_precision", "policy": POLICY}
        return policy_result, {**used, "eager": {"failed_checks": eager_result.failed}}
    failed = {"failed_checks": policy_result.failed}
    return eager_result, {"used": "eager", "kernel_precision": failed}


def verdict(
    components: list[M.ComponentMetrics], logits: M.LogitMetrics
) -> tuple[bool, Divergence | None, list[str]]:
    """Equivalent iff every component passes its gate and every logit gate
    passes; the first failure in data-flow order is named."""
    failed: list[str] = []
    first: Divergence | None = None
    for result in components:
        if result.passed:
            continue
        failed.append(f"{result.name} ({result.phase}): {result.gate}")
        if first is None:
            value = result.rel_error if result.gate == "rel_error" else result.r_ratio
            if result.note:
                detail = result.note
            else:
                comparison = "<=" if result.gate == "rel_error" else "<"
                detail = f"{result.gate} {_fmt(value)} (needs {comparison} {result.tolerance:g})"
            first = Divergence(
                component=result.name,
                phase=result.phase,
                metric=result.gate,
                value=value,
                tolerance=result.tolerance,
                message=f"first diverging component: {result.name} ({result.phase}, "
                f"module {result.module}): {detail}",
            )
    for gate, ok in logits.gates.items():
        if ok:
            continue
        failed.append(f"logits: {gate}")
        if first is None:
            first = Divergence(
                component="logits",
                phase=(logits.first_failing_token or {}).get("phase")
                if gate == "two_way_all_tokens"
                else None,
                metric=gate,
                value=_gate_value(gate, logits),
                tolerance=None,
                message=f"logits fail the {gate} check ({_gate_detail(gate, logits)})",
            )
    return not failed, first, failed


def _gate_value(gate: str, logits: M.LogitMetrics) -> float | None:
    return {
        "two_way_all_tokens": logits.tokens_passed / max(logits.tokens, 1),
        "logit_validation": logits.sigma_ratio,
        "three_way": logits.sigma_ratio,
        "cosine": logits.cosine_p5,
        "top1_agreement": logits.top1_agreement,
        "greedy_match": logits.greedy_match,
    }.get(gate)


def _gate_detail(gate: str, logits: M.LogitMetrics) -> str:
    if gate == "two_way_all_tokens":
        token = logits.first_failing_token or {}
        return (
            f"{logits.tokens - logits.tokens_passed} of {logits.tokens} tokens fail; first: "
            f"{token.get('phase')} sequence {token.get('sequence')} position {token.get('position')}, "
            f"{token.get('label')}"
        )
    if gate in ("logit_validation", "three_way"):
        return (
            f"{logits.tokens - logits.tokens_passed} of {logits.tokens} tokens fail the two-way check, "
            f"sigma-ratio {_fmt(logits.sigma_ratio)} (<= {M.SIGMA_RATIO_MAX}), "
            f"Bhattacharyya {_fmt(logits.bhattacharyya)} (>= {M.BHATTACHARYYA_MIN}), "
            f"worst per-sequence L-inf ratio {_fmt(logits.linf_ratio_max)} (< {M.LINF_RATIO_MAX}), "
            f"worst per-sequence L2 ratio {_fmt(logits.l2_ratio_max)} (< {M.L2_RATIO_MAX})"
        )
    if gate == "cosine":
        return f"p5 {_fmt(logits.cosine_p5)}, {logits.cosine_fraction_below:.1%} below {M.COSINE_THRESHOLD}"
    if gate == "top1_agreement":
        return f"{logits.top1_agreement:.1%}, needs > {M.TOP1_AGREEMENT_MIN:.0%}"
    return f"{logits.greedy_match:.1%}, needs > {M.GREEDY_MATCH_MIN:.0%}"


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3g}"


def tolerances(dtype: str) -> dict:
    return {
        "component_gate": "rel_error" if dtype == "fp32" else "r_ratio",
        "fp32_rel_error": M.FP32_REL_ERROR_TOLERANCE,
        "r_ratio": M.R_RATIO_TOLERANCE,
        "topk_tolerance_map": {k: {"atol": a, "rtol": r} for k, (a, r) in M.DEFAULT_TOLERANCE_MAP.items()},
        "divergence_n_ulps": M.DIVERGENCE_N_ULPS,
        "divergence_mantissa_bits": M.MANTISSA_BITS[dtype],
        "sigma_ratio_max": M.SIGMA_RATIO_MAX,
        "bhattacharyya_min": M.BHATTACHARYYA_MIN,
        "linf_ratio_max": M.LINF_RATIO_MAX,
        "l2_ratio_max": M.L2_RATIO_MAX,
        "cosine_threshold": M.COSINE_THRESHOLD,
        "cosine_max_fraction_below": M.COSINE_MAX_FRACTION_BELOW,
        "top1_agreement_min": M.TOP1_AGREEMENT_MIN,
        "greedy_match_min": M.GREEDY_MATCH_MIN,
    }
