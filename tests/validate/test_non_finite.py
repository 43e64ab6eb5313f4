"""A port whose outputs are NaN or infinite is a wrong port (exit 1, the
first component named), never an internal error of the validator."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from autoport_cst.validate import metrics as M
from autoport_cst.validate import validate_model

ROOT = Path(__file__).resolve().parents[2]


def test_all_non_finite_logits_fail_the_token() -> None:
    expected = torch.randn(64)
    check = M.check_token(expected, torch.full((64,), float("nan")))
    assert not check.passed and check.label == "Non-finite"
    check = M.check_token(expected, torch.full((64,), float("inf")))
    assert not check.passed and not check.argmax_match


def test_one_non_finite_logit_fails_the_token() -> None:
    expected = torch.randn(64)
    actual = expected.clone()
    actual[3] = float("inf")
    assert not M.check_token(expected, actual).passed


def test_logit_metrics_of_nan_logits_fail() -> None:
    expected = torch.randn(3, 32)
    target = torch.full((3, 32), float("nan"))
    positions = [("prefill", 0, i) for i in range(3)]
    found = M.logit_metrics(target, expected, expected, expected + 1e-3, positions, [[]], [[]], "fp32")
    assert not found.gates["two_way_all_tokens"]
    found = M.logit_metrics(target, expected, expected, expected + 1e-3, positions, [[]], [[]], "bf16")
    assert not all(found.gates.values())


def test_component_with_nan_output_is_named_non_finite() -> None:
    reference = torch.randn(4, 8)
    target = reference.clone()
    target[1, 2] = float("nan")
    found = M.component_metrics("layers.0.attention", "prefill", "m", target, reference, reference, "fp32")
    assert not found.passed
    assert found.note is not None and "non-finite output: 1 of 32 values (1 NaN" in found.note


@pytest.mark.slow
def test_rope_dividing_by_sin_exits_1(tmp_path: Path) -> None:
    """``rotated / sin``: sin(0) = 0 makes every logit non-finite."""
    from autoport_cst.validate.tiny import build_tiny_checkpoint

    checkpoint = tmp_path / "tiny"
    build_tiny_checkpoint("Qwen3ForCausalLM", checkpoint, seed=0)
    port = tmp_path / "port"
    shutil.copytree(ROOT / "reference_models" / "qwen3", port, ignore=shutil.ignore_patterns("__pycache__"))
    model = port / "model.py"
    text = model.read_text(encoding="utf-8")
    assert text.count("rotated * sin") == 1
    model.write_text(text.replace("rotated * sin", "rotated / sin"), encoding="utf-8")
    report = validate_model(port, checkpoint, steps=2)
    assert report.exit_code == 1 and not report.equivalent
    assert report.first_diverging.component == "layers.0.attention"
