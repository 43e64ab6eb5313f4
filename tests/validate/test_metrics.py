"""Metric definitions (docs/validation.md)."""

from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from autoport_cst.validate import metrics as M


def test_identical_logits_match() -> None:
    logits = torch.linspace(-3, 5, 100)
    check = M.check_token(logits, logits.clone())
    assert check.passed and check.label == "Matched" and check.argmax_match


@settings(max_examples=30, deadline=None, database=None)
@given(shift=st.floats(min_value=-50, max_value=50), seed=st.integers(0, 1000))
def test_a_constant_shift_is_removed(shift: float, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    expected = torch.randn(200, generator=generator, dtype=torch.float64) * 3
    check = M.check_token(expected, expected + shift)
    assert check.passed, check.errors


def test_topk_error_detects_a_perturbed_top_logit() -> None:
    expected = torch.linspace(0, 10, 64, dtype=torch.float64)
    actual = expected.clone()
    actual[-2] += 0.5  # second-best logit moves by 5 % of the top logit
    check = M.check_token(expected, actual)
    assert not check.levels_passed["5"] and check.errors["5"] > 0.011


def test_divergence_within_one_ulp_is_acceptable() -> None:
    expected = torch.tensor([1.0, 4.0, 4.0 - 2**-6, 0.0], dtype=torch.float64)
    actual = torch.tensor([1.0, 4.0 - 2**-6, 4.0, 0.0], dtype=torch.float64)
    check = M.check_token(expected, actual, mantissa_bits=7)  # bf16 ULP at 4 is 2**-5
    assert not check.argmax_match and check.divergence <= check.divergence_bound
    assert check.label.startswith("Acceptable divergence")
    strict = M.check_token(expected, actual, mantissa_bits=23)
    assert strict.label.startswith("Diverged") and not strict.passed


def test_r_ratio_is_port_error_over_reference_bf16_error() -> None:
    f = torch.ones(10, 4, dtype=torch.float64)
    b = f + 0.01
    assert math.isclose(M.r_ratio(f + 0.01, b, f), 1.0, rel_tol=1e-4)  # eps = 1e-7 ||f|| in the denominator
    assert math.isclose(M.r_ratio(f + 0.03, b, f), 3.0, rel_tol=1e-4)  # eps = 1e-7 ||f|| in the denominator
    assert M.r_ratio(f, f, f) == 0.0


def test_kl_and_cosine() -> None:
    logits = torch.randn(3, 10, dtype=torch.float64)
    assert torch.allclose(M.row_kl(logits, logits), torch.zeros(3, dtype=torch.float64))
    assert torch.allclose(M.row_cosines(logits, 2 * logits), torch.ones(3, dtype=torch.float64))
    assert float(M.row_kl(logits, -logits).min()) > 0


def _three_way(
    target: torch.Tensor, bf16: torch.Tensor, fp32: torch.Tensor, sequences: list[int]
) -> M.LogitMetrics:
    positions = [("prefill", s, i) for i, s in enumerate(sequences)]
    return M.logit_metrics(target, bf16, fp32, bf16, positions, [], [], "bf16")


def test_three_way_ratios_are_taken_per_sequence() -> None:
    """Independent rounding noise of the same size: one row where transformers
    rounded luckily gives a large single-token ratio (reported) while every
    sequence's ratio stays about 1 (gated)."""
    generator = torch.Generator().manual_seed(0)
    f = torch.randn(12, 50, generator=generator, dtype=torch.float64) * 5
    noise_b = torch.randn(12, 50, generator=generator, dtype=torch.float64) * 0.05
    noise_t = torch.randn(12, 50, generator=generator, dtype=torch.float64) * 0.05
    noise_b[3] *= 0.1  # a lucky row for the bf16 reference
    metrics = _three_way(f + noise_t, f + noise_b, f, [0] * 6 + [1] * 6)
    assert metrics.token_l2_ratio_max > 5 and metrics.token_linf_ratio_max > 5
    assert metrics.l2_ratio_max < 1.5 and metrics.linf_ratio_max < 1.5
    assert metrics.gates["three_way"]


def test_one_wrong_token_fails_the_per_sequence_linf_ratio() -> None:
    generator = torch.Generator().manual_seed(1)
    f = torch.randn(12, 50, generator=generator, dtype=torch.float64) * 5
    noise = torch.randn(12, 50, generator=generator, dtype=torch.float64) * 0.05
    target = f + noise.flip(0)
    target[7, 11] += 1.0  # one logit of one token off by 20 bf16 noise sigmas
    metrics = _three_way(target, f + noise, f, [0] * 6 + [1] * 6)
    assert metrics.linf_ratio_max > M.LINF_RATIO_MAX
    assert not metrics.gates["three_way"]


def test_worst_error_ratios_of_exact_reference_rows() -> None:
    zero = torch.zeros(2, 3, dtype=torch.float64)
    assert M.worst_error_ratios(zero, zero, [0, 1]) == (0.0, 0.0)
    assert M.worst_error_ratios(zero + 1, zero, [0, 0]) == (math.inf, math.inf)


def test_padded_hidden_size_is_compared_on_the_model_columns() -> None:
    """A port that pads the hidden size (GPT-OSS: 3072) is compared on the
    model's first columns; the padding is named, not failed."""
    generator = torch.Generator().manual_seed(0)
    reference = torch.randn(5, 8, generator=generator)
    padded = torch.cat((reference, torch.zeros(5, 24)), dim=1)
    row = M.component_metrics("layers.0.mlp", "prefill", "m", padded, reference, reference.clone(), "fp32")
    assert row.passed and row.rel_error == 0.0 and row.compared_columns == "8 of 32"
    wrong = M.component_metrics("layers.0.mlp", "prefill", "m", padded[:, :6], reference, None, "fp32")
    assert not wrong.passed and "shape mismatch" in wrong.note
