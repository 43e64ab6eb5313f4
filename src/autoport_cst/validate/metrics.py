"""Equivalence metrics (definitions and tolerances: docs/validation.md).

All computations are in float64 on tensors the caller aligned row by row
(one row per token position). Notation: ``t`` the port ("target"), ``f`` the
transformers float32 baseline, ``b`` transformers in bfloat16, ``e`` the
"expected" logits of the two-way check (transformers in the validated dtype).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

TOPK_LEVELS = ("5", "50", "1000", "all")
# Neuron logit validation defaults: level -> (atol, rtol)
DEFAULT_TOLERANCE_MAP: dict[str, tuple[float, float]] = {
    "5": (1e-5, 0.011),
    "50": (1e-5, 0.02),
    "1000": (1e-5, 0.03),
    "all": (1e-5, 0.05),
}
DIVERGENCE_N_ULPS = 1
MANTISSA_BITS = {"fp32": 23, "bf16": 7}

# Component and end-to-end gates
FP32_REL_ERROR_TOLERANCE = 1e-5  # port fp32 vs transformers fp32, Frobenius
R_RATIO_TOLERANCE = 1.2  # port bf16 error over transformers bf16 error
COSINE_THRESHOLD = 0.95  # per-position cosine (condition B)
COSINE_MAX_FRACTION_BELOW = 0.05
TOP1_AGREEMENT_MIN = 0.5  # Stage 5: more than half of the positions
GREEDY_MATCH_MIN = 0.3  # Stage 1 liveness
# Three-way (bf16) logit checks of the Neuron accuracy tooling
SIGMA_RATIO_MAX = 1.0
BHATTACHARYYA_MIN = 0.99
BHATTACHARYYA_BINS = 100
LINF_RATIO_MAX = 5.0
L2_RATIO_MAX = 3.0
R_EPSILON_FLOOR = 1e-12
R_EPSILON_RELATIVE = 1e-7


# -- tensors ---------------------------------------------------------------------


def frobenius(x: torch.Tensor) -> float:
    return float(torch.linalg.vector_norm(x.to(torch.float64)))


def rel_error(target: torch.Tensor, reference: torch.Tensor) -> float:
    """``||t - f||_F / ||f||_F`` (0 when both are zero)."""
    diff = frobenius(target.double() - reference.double())
    norm = frobenius(reference)
    if norm == 0.0:
        return 0.0 if diff == 0.0 else math.inf
    return diff / norm


def r_ratio(target: torch.Tensor, ref_bf16: torch.Tensor, ref_fp32: torch.Tensor) -> float:
    """``||t - f|| / (||b - f|| + eps)``, ``eps = max(1e-12, 1e-7 ||f||)``."""
    f = ref_fp32.double()
    eps = max(R_EPSILON_FLOOR, R_EPSILON_RELATIVE * frobenius(f))
    return frobenius(target.double() - f) / (frobenius(ref_bf16.double() - f) + eps)


def row_cosines(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Cosine similarity of each row of ``a`` with the same row of ``b``."""
    a64, b64 = a.double(), b.double()
    dot = (a64 * b64).sum(-1)
    norms = torch.linalg.vector_norm(a64, dim=-1) * torch.linalg.vector_norm(b64, dim=-1)
    both_zero = norms == 0
    return torch.where(both_zero, torch.ones_like(dot), dot / norms.clamp_min(1e-300))


def row_kl(reference_logits: torch.Tensor, target_logits: torch.Tensor) -> torch.Tensor:
    """``D_KL(softmax(f) || softmax(t))`` per row, clamped at 0."""
    log_p = torch.log_softmax(reference_logits.double(), dim=-1)
    log_q = torch.log_softmax(target_logits.double(), dim=-1)
    return (log_p.exp() * (log_p - log_q)).sum(-1).clamp_min(0.0)


def bhattacharyya(errors_a: torch.Tensor, errors_b: torch.Tensor, bins: int = BHATTACHARYYA_BINS) -> float:
    """Bhattacharyya coefficient of the histograms (shared bins over
    ``[0, max]``) of two sets of absolute errors."""
    a, b = errors_a.double().reshape(-1), errors_b.double().reshape(-1)
    top = float(torch.maximum(a.max(), b.max())) if a.numel() and b.numel() else 0.0
    if top == 0.0:
        return 1.0
    if not math.isfinite(top):
        return 0.0  # non-finite errors share no bin with finite ones
    ha = torch.histc(a, bins=bins, min=0.0, max=top)
    hb = torch.histc(b, bins=bins, min=0.0, max=top)
    ha, hb = ha / ha.sum(), hb / hb.sum()
    return float((ha * hb).sqrt().sum())


def percentile(values: torch.Tensor, q: float) -> float:
    if values.numel() == 0:
        return math.nan
    return float(torch.quantile(values.double(), q / 100.0))


def worst_error_ratios(
    target_error: torch.Tensor, reference_error: torch.Tensor, groups: list
) -> tuple[float, float]:
    """The worst L-inf and L2 ratios, ``max|t - f| / max|b - f|`` and
    ``||t - f|| / ||b - f||``, each taken over the rows of one group and then
    maximised over the groups (``groups[i]`` names row ``i``'s group).

    The three-way check's groups are the sequences, the "inputs" of the Neuron
    tooling's ``assert_close_three_way`` (docs/validation.md); with one group
    per row the same ratios describe single tokens, whose denominators are
    single draws of bf16 rounding noise."""
    members: dict = {}
    for row, group in enumerate(groups):
        members.setdefault(group, []).append(row)
    linf = l2 = 0.0
    for rows in members.values():
        t, b = target_error[rows], reference_error[rows]
        linf = max(linf, _ratio(float(t.abs().max()), float(b.abs().max())))
        l2 = max(l2, _ratio(frobenius(t), frobenius(b)))
    return linf, l2


def _ratio(target: float, reference: float) -> float:
    if reference > 0:
        return target / reference
    return 0.0 if target == 0 else math.inf


# -- two-way logit check -----------------------------------------------------------


@dataclass
class TokenCheck:
    """The two-way check of one token's logits."""

    errors: dict[str, float]
    levels_passed: dict[str, bool]
    argmax_match: bool
    divergence: float | None
    divergence_bound: float | None
    label: str
    passed: bool


def ulp(value: float, mantissa_bits: int) -> float:
    value = abs(value)
    if value == 0.0:
        return 2.0 ** (-126 - mantissa_bits)
    return 2.0 ** (math.floor(math.log2(value)) - mantissa_bits)


def check_token(
    expected: torch.Tensor,
    actual: torch.Tensor,
    tolerance_map: dict[str, tuple[float, float]] = DEFAULT_TOLERANCE_MAP,
    mantissa_bits: int = MANTISSA_BITS["bf16"],
    n_ulps: int | None = DIVERGENCE_N_ULPS,
) -> TokenCheck:
    """Per-top-k error after removing a constant shift, plus the argmax
    divergence bound (docs/validation.md, "Two-way logit check")."""
    e = expected.double().reshape(-1)
    a = actual.double().reshape(-1)
    if bool((torch.isfinite(e) & ~torch.isfinite(a)).any()):
        return _non_finite_token(tolerance_map)
    finite = torch.isfinite(e) & torch.isfinite(a)
    e, a = e[finite], a[finite]
    # least-squares a ~ slope * e + shift; only the shift is removed
    e_mean, a_mean = e.mean(), a.mean()
    var = ((e - e_mean) ** 2).sum()
    slope = ((e - e_mean) * (a - a_mean)).sum() / var if var > 0 else torch.tensor(1.0, dtype=torch.float64)
    shift = a_mean - slope * e_mean
    shifted = a - shift
    errors: dict[str, float] = {}
    passed: dict[str, bool] = {}
    for level, (atol, rtol) in tolerance_map.items():
        if level == "all":
            e_k, a_k = e, shifted
        else:
            k = min(int(level), e.numel())
            index = torch.unique(torch.cat((torch.topk(e, k).indices, torch.topk(shifted, k).indices)))
            e_k, a_k = e[index], shifted[index]
        scale = float(e_k.abs().max()) if e_k.numel() else 0.0
        error = (float((a_k - e_k).abs().max()) - atol) / scale if scale > 0 else 0.0
        errors[level] = error
        passed[level] = error <= rtol
    top_e, top_a = int(torch.argmax(e)), int(torch.argmax(a))
    divergence = bound = None
    divergence_ok = True
    if top_e != top_a:
        divergence = float((a[top_a] - a[top_e]).abs())
        if n_ulps is None:
            bound = 1e-3
        else:
            bound = n_ulps * ulp(max(abs(float(a[top_a])), abs(float(a[top_e]))), mantissa_bits)
        divergence_ok = divergence <= bound
    levels_ok = all(passed.values())
    if top_e == top_a:
        label = "Matched" if levels_ok else "TopK errors"
    else:
        label = "Acceptable divergence" if divergence_ok else "Diverged"
        if not levels_ok:
            label += " with TopK errors"
    return TokenCheck(errors, passed, top_e == top_a, divergence, bound, label, levels_ok and divergence_ok)


def _non_finite_token(tolerance_map: dict[str, tuple[float, float]]) -> TokenCheck:
    """A token whose logits are NaN or infinite where transformers' are
    finite: wrong at every level, nothing to measure."""
    levels = {level: math.inf for level in tolerance_map}
    return TokenCheck(levels, dict.fromkeys(tolerance_map, False), False, None, None, "Non-finite", False)


# -- aggregates ------------------------------------------------------------------


@dataclass
class LogitMetrics:
    tokens: int
    tokens_passed: int
    labels: dict[str, int]
    topk_max_error: dict[str, float]
    topk_rtol: dict[str, float]
    topk_passed: dict[str, bool]
    max_abs_error: float
    max_rel_error: float
    rel_error: float
    cosine_min: float
    cosine_p5: float
    cosine_fraction_below: float
    kl_mean: float
    kl_p95: float
    kl_max: float
    top1_agreement: float
    greedy_match: float
    greedy_first_mismatch: list[int | None]
    sigma_ratio: float | None
    bhattacharyya: float | None
    linf_ratio_max: float | None  # worst over sequences (gated)
    l2_ratio_max: float | None  # worst over sequences (gated)
    token_linf_ratio_max: float | None  # worst over single tokens (reported only)
    token_l2_ratio_max: float | None  # worst over single tokens (reported only)
    first_failing_token: dict | None = None
    gates: dict[str, bool] = field(default_factory=dict)


def logit_metrics(
    target: torch.Tensor,
    expected: torch.Tensor,
    baseline_fp32: torch.Tensor,
    reference_bf16: torch.Tensor | None,
    positions: list[tuple[str, int, int]],
    greedy_rows: list[list[int]],
    greedy_tokens: list[list[int]],
    dtype: str,
) -> LogitMetrics:
    """Aggregate logit metrics over all rows (token positions).

    ``positions[i]`` names row ``i`` as ``(phase, sequence, position)``;
    ``greedy_rows[b]`` are the rows of sequence ``b`` that predict a generated
    token and ``greedy_tokens[b]`` the float32 greedy tokens they should give.
    """
    two_way = _two_way(target, expected, positions, MANTISSA_BITS[dtype])
    t64, e64, f64 = target.double(), expected.double(), baseline_fp32.double()
    diff = (t64 - e64).abs()
    per_row_rel = diff.max(-1).values / e64.abs().max(-1).values.clamp_min(1e-300)
    cosines = row_cosines(t64, f64)
    kl = row_kl(f64, t64)
    greedy, first_mismatch = _greedy_match(t64.argmax(-1), greedy_rows, greedy_tokens)
    three_way = _three_way(t64, f64, reference_bf16, positions)
    metrics = LogitMetrics(
        tokens=target.shape[0],
        tokens_passed=two_way.passed,
        labels=two_way.labels,
        topk_max_error=two_way.worst,
        topk_rtol={level: rtol for level, (_atol, rtol) in DEFAULT_TOLERANCE_MAP.items()},
        topk_passed={
            level: two_way.worst[level] <= DEFAULT_TOLERANCE_MAP[level][1] for level in two_way.worst
        },
        max_abs_error=float(diff.max()),
        max_rel_error=float(per_row_rel.max()),
        rel_error=rel_error(t64, e64),
        cosine_min=float(cosines.min()),
        cosine_p5=percentile(cosines, 5),
        cosine_fraction_below=float((cosines < COSINE_THRESHOLD).double().mean()),
        kl_mean=float(kl.mean()),
        kl_p95=percentile(kl, 95),
        kl_max=float(kl.max()),
        top1_agreement=float((t64.argmax(-1) == f64.argmax(-1)).double().mean()),
        greedy_match=greedy,
        greedy_first_mismatch=first_mismatch,
        sigma_ratio=three_way.sigma_ratio,
        bhattacharyya=three_way.bhattacharyya,
        linf_ratio_max=three_way.linf_ratio_max,
        l2_ratio_max=three_way.l2_ratio_max,
        token_linf_ratio_max=three_way.token_linf_ratio_max,
        token_l2_ratio_max=three_way.token_l2_ratio_max,
        first_failing_token=two_way.first_failing,
    )
    metrics.gates = _logit_gates(metrics, dtype)
    return metrics


@dataclass
class _TwoWay:
    """The two-way check over all rows."""

    labels: dict[str, int]
    worst: dict[str, float]  # worst top-k error per level
    passed: int
    first_failing: dict | None


def _two_way(
    target: torch.Tensor, expected: torch.Tensor, positions: list[tuple[str, int, int]], mantissa: int
) -> _TwoWay:
    result = _TwoWay({}, {level: -math.inf for level in DEFAULT_TOLERANCE_MAP}, 0, None)
    for row in range(target.shape[0]):
        check = check_token(expected[row], target[row], DEFAULT_TOLERANCE_MAP, mantissa)
        result.labels[check.label] = result.labels.get(check.label, 0) + 1
        for level, error in check.errors.items():
            result.worst[level] = max(result.worst[level], error)
        if check.passed:
            result.passed += 1
        elif result.first_failing is None:
            phase, sequence, position = positions[row]
            result.first_failing = {
                "phase": phase,
                "sequence": sequence,
                "position": position,
                "label": check.label,
                "errors": check.errors,
            }
    return result


def _greedy_match(
    port_argmax: torch.Tensor, greedy_rows: list[list[int]], greedy_tokens: list[list[int]]
) -> tuple[float, list[int | None]]:
    """The fraction of the greedy tokens the port's argmax gives, and each
    sequence's first step that does not."""
    matches = total = 0
    first_mismatch: list[int | None] = []
    for rows, tokens in zip(greedy_rows, greedy_tokens, strict=False):
        mismatch = None
        for step, (row, token) in enumerate(zip(rows, tokens, strict=False)):
            total += 1
            if int(port_argmax[row]) == token:
                matches += 1
            elif mismatch is None:
                mismatch = step
        first_mismatch.append(mismatch)
    return (matches / total if total else 1.0), first_mismatch


@dataclass
class _ThreeWay:
    """The three-way statistics against the bf16 reference (None without one)."""

    sigma_ratio: float | None = None
    bhattacharyya: float | None = None
    linf_ratio_max: float | None = None
    l2_ratio_max: float | None = None
    token_linf_ratio_max: float | None = None
    token_l2_ratio_max: float | None = None


def _three_way(
    t64: torch.Tensor, f64: torch.Tensor, reference_bf16: torch.Tensor | None, positions: list
) -> _ThreeWay:
    found = _ThreeWay()
    if reference_bf16 is None:
        return found
    b64 = reference_bf16.double()
    base = float(((b64 - f64) ** 2).mean().sqrt())
    tgt = float(((t64 - f64) ** 2).mean().sqrt())
    found.sigma_ratio = _ratio(tgt, base)
    found.bhattacharyya = bhattacharyya((b64 - f64).abs(), (t64 - f64).abs())
    sequences = [p[1] for p in positions]
    found.linf_ratio_max, found.l2_ratio_max = worst_error_ratios(t64 - f64, b64 - f64, sequences)
    found.token_linf_ratio_max, found.token_l2_ratio_max = worst_error_ratios(
        t64 - f64, b64 - f64, list(range(len(positions)))
    )
    return found


def _logit_gates(metrics: LogitMetrics, dtype: str) -> dict[str, bool]:
    two_way = metrics.tokens_passed == metrics.tokens
    sigma, bc = metrics.sigma_ratio, metrics.bhattacharyya
    linf_ratio, l2_ratio = metrics.linf_ratio_max, metrics.l2_ratio_max
    if dtype == "fp32" or sigma is None:
        gates = {"two_way_all_tokens": two_way}
    else:
        sigma_ok = sigma <= SIGMA_RATIO_MAX
        bc_ok = bc is not None and bc >= BHATTACHARYYA_MIN
        gates = {
            # Neuron multi-prompt verdict: all tokens pass, or sigma-ratio, or BC
            "logit_validation": two_way or sigma_ok or bc_ok,
            # Neuron assert_close_three_way
            "three_way": (bc_ok or sigma_ok)
            and linf_ratio is not None
            and linf_ratio < LINF_RATIO_MAX
            and l2_ratio is not None
            and l2_ratio < L2_RATIO_MAX,
        }
    return {
        **gates,
        "cosine": metrics.cosine_p5 >= COSINE_THRESHOLD
        and metrics.cosine_fraction_below <= COSINE_MAX_FRACTION_BELOW,
        "top1_agreement": metrics.top1_agreement > TOP1_AGREEMENT_MIN,
        "greedy_match": metrics.greedy_match > GREEDY_MATCH_MIN,
    }


@dataclass
class ComponentMetrics:
    name: str
    phase: str
    module: str
    rows: int
    rel_error: float | None
    max_abs_error: float | None
    cosine_min: float | None
    r_ratio: float | None
    gate: str
    tolerance: float
    passed: bool
    note: str | None = None
    compared_columns: str | None = None  # "H of W" when the port pads the hidden size


def component_metrics(
    name: str,
    phase: str,
    module: str,
    target: torch.Tensor,
    ref_fp32: torch.Tensor,
    ref_bf16: torch.Tensor | None,
    dtype: str,
) -> ComponentMetrics:
    """Compare one component's outputs (rows aligned)."""
    gate, tolerance = (
        ("rel_error", FP32_REL_ERROR_TOLERANCE) if dtype == "fp32" else ("r_ratio", R_RATIO_TOLERANCE)
    )
    columns = None
    if _padded_width(target, ref_fp32):
        columns = f"{ref_fp32.shape[1]} of {target.shape[1]}"
        target = target[:, : ref_fp32.shape[1]]
    if target.shape != ref_fp32.shape:
        return ComponentMetrics(
            name,
            phase,
            module,
            int(ref_fp32.shape[0]),
            None,
            None,
            None,
            None,
            gate,
            tolerance,
            False,
            note=f"shape mismatch: port {list(target.shape)} vs transformers {list(ref_fp32.shape)}",
        )
    non_finite = _non_finite_note(target, ref_fp32)
    rel = rel_error(target, ref_fp32)
    ratio = r_ratio(target, ref_bf16, ref_fp32) if ref_bf16 is not None else None
    value = rel if gate == "rel_error" else ratio
    passed = (
        value is not None
        and math.isfinite(value)
        and (value <= tolerance if gate == "rel_error" else value < tolerance)
    )
    return ComponentMetrics(
        name,
        phase,
        module,
        int(target.shape[0]),
        rel,
        float((target.double() - ref_fp32.double()).abs().max()) if target.numel() else 0.0,
        float(row_cosines(target, ref_fp32).min()) if target.numel() else 1.0,
        ratio,
        gate,
        tolerance,
        passed and not non_finite,
        note=non_finite or None,
        compared_columns=columns,
    )


def _non_finite_note(target: torch.Tensor, reference: torch.Tensor) -> str:
    """``"non-finite output: ..."`` when the port gives NaN or infinity where
    transformers gives a finite value, else ``""``."""
    wrong = ~torch.isfinite(target) & torch.isfinite(reference)
    if not bool(wrong.any()):
        return ""
    nans = int((wrong & torch.isnan(target)).sum())
    return (
        f"non-finite output: {int(wrong.sum())} of {wrong.numel()} values "
        f"({nans} NaN, {int(wrong.sum()) - nans} infinite) where transformers' are finite"
    )


def _padded_width(target: torch.Tensor, reference: torch.Tensor) -> bool:
    """A port that pads the hidden size (GPT-OSS pads it to 3072) keeps the
    model's columns first: compare those."""
    return (
        target.dim() == reference.dim() == 2
        and target.shape[0] == reference.shape[0]
        and target.shape[1] > reference.shape[1]
    )
