"""Copies of the qwen3_moe reference with one ``NF.moe_cte`` option changed
fail validation: the stand-in implements each option the way the kernel
does, or refuses it by name; none is accepted and ignored."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from autoport_cst.validate import validate_model

from .conftest import QWEN3_MOE


def _mutant(tmp_path: Path, pattern: str, replacement: str) -> Path:
    target = tmp_path / "mutant"
    shutil.copytree(QWEN3_MOE, target, ignore=shutil.ignore_patterns("__pycache__"))
    model = target / "model.py"
    text, count = re.subn(pattern, replacement, model.read_text(encoding="utf-8"))
    assert count == 1, pattern
    model.write_text(text, encoding="utf-8")
    return target


@pytest.mark.parametrize(
    "pattern, replacement, stage, message",
    [
        # the -1 padding slots of the mapping are read as rows without the skip mode
        (r"skip_token=True", "skip_token=False", "prefill", "skip_token=True"),
        # a token routed to two experts keeps one of them
        (r"is_tensor_update_accumulating=True", "is_tensor_update_accumulating=False", None, None),
        # the experts computed in bf16 in an fp32 run
        (r"compute_dtype=self\.compute_dtype", "compute_dtype=nl.bfloat16", None, None),
    ],
)
def test_a_changed_moe_cte_option_fails(tmp_path, tiny_qwen3_moe, pattern, replacement, stage, message):
    report = validate_model(_mutant(tmp_path, pattern, replacement), tiny_qwen3_moe, steps=2)
    assert not report.equivalent and report.exit_code == 1
    if stage is None:
        assert report.first_diverging.component.endswith(".mlp"), report.summary()
    else:
        assert report.failure.stage == stage and message in report.failure.message


def test_the_decode_kernel_without_all_expert_mode_fails_at_expert_parallelism(tmp_path, tiny_qwen3_moe):
    # only expert parallelism (a default layout of an MoE checkpoint: parallel_checks.MOE_LAYOUTS)
    # gives a rank fewer experts than the router scores; the selective-expert mode looks the
    # top-k's global ids up in the local weights and reads no rank_id
    mutant = _mutant(tmp_path, r"\n\s*is_all_expert=use_all_experts,", "")
    report = validate_model(mutant, tiny_qwen3_moe, steps=2, tp=2, ep=2)
    assert not report.equivalent and report.exit_code == 1
    assert report.failure.stage == "decode" and "selective-expert mode" in report.failure.message
    assert validate_model(QWEN3_MOE, tiny_qwen3_moe, steps=2, tp=2, ep=2).equivalent
