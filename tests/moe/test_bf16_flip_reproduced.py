"""A bf16 validation of the qwen3_moe reference that passes with a large
logit error is transformers' own bf16 routing flip, reproduced by the port,
not an excused near tie nor a tolerance hole.

On the tiny Qwen3-MoE of seed 0 with every layer MoE (``keep_layer_kinds``,
16 decode steps) the bf16 validation passes the free-routing comparison (no
teacher-forced evidence is needed) with a worst logit error near 0.9 and a
row whose cosine to the float32 logits is about 0.5. That row is one where
transformers' own bf16 run departs from its float32 run just as much: the
port's logits there are those of transformers in bf16 (cosine above 0.999),
so the three-way gates, which measure the port's error against transformers'
bf16 error, rightly pass it. Router mutants (scores by sigmoid instead of
softmax; the top-k always renormalised where Qwen3-MoE's config does not)
still fail there in bf16, with teacher-forced routing too.
(Measured 2026-12-03; the seed-3 checkpoint is the excused case: free
routing diverges at two near-tie tokens, margins 0.0016 and 0.0055 against a
bf16 resolution of 0.059, and the teacher-forced comparison passes.)
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from autoport_cst.validate import build_tiny_checkpoint, compare, validate_model
from autoport_cst.validate.api import _plan
from autoport_cst.validate.reference import greedy_teacher, load_reference, run_reference
from tests.edited_copies import edited_copy

from .conftest import QWEN3_MOE

STEPS = 16
ROUTER_MUTANTS = {
    "sigmoid scores": [
        ('activation="softmax"', 'activation="sigmoid"'),
        ("router_act_fn=RouterActFnType.SOFTMAX", "router_act_fn=RouterActFnType.SIGMOID"),
    ],
    "always renormalised": [
        ("        if self.norm_topk_prob:\n", "        if True:\n"),
        ("norm_topk_prob=self.norm_topk_prob,", "norm_topk_prob=True,"),
    ],
}


@pytest.fixture(scope="module")
def seed0(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("tiny-qwen3-moe-all-moe-seed0")
    build_tiny_checkpoint("Qwen3MoeForCausalLM", directory, seed=0, keep_layer_kinds=True)
    return directory


def _logit_rows(report, checkpoint: Path) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The port's, transformers' float32 and bf16 logits, row by row."""
    scenario = _plan(
        QWEN3_MOE, checkpoint, tp=1, dtype="bf16", steps=STEPS, prompt_lengths=None, block_size=None, seed=0
    ).scenario
    fp32 = load_reference(checkpoint, torch.float32)
    teacher = greedy_teacher(fp32, scenario.prompts, STEPS)
    runs = [
        run_reference(m, scenario.prompts, teacher)
        for m in (fp32, load_reference(checkpoint, torch.bfloat16))
    ]
    port = report.port_output
    f, b = (
        torch.cat(
            [compare._ref_logits(run.logits, scenario, phase, port) for phase in compare.PHASES]
        ).double()
        for run in runs
    )
    return torch.cat(port.prefill_logits + port.decode_logits).double(), f, b


@pytest.mark.slow
def test_the_worst_row_is_transformers_own_bf16_flip(seed0: Path):
    report = validate_model(QWEN3_MOE, seed0, dtype="bf16", steps=STEPS)
    assert report.equivalent, report.summary()
    if report.routing is not None or report.logits["cosine_min"] > 0.9:
        pytest.skip("this checkpoint no longer has a bf16 flip on the free comparison")
    port, f, b = _logit_rows(report, seed0)
    worst = int((port - f).abs().amax(dim=-1).argmax())
    cosine = torch.nn.functional.cosine_similarity
    assert cosine(port[worst], f[worst], dim=0) < 0.9  # far from float32 ...
    assert cosine(b[worst], f[worst], dim=0) < 0.9  # ... as transformers' bf16 is
    assert cosine(port[worst], b[worst], dim=0) > 0.999  # ... the same row as transformers' bf16


@pytest.mark.slow
@pytest.mark.parametrize("mutant", sorted(ROUTER_MUTANTS))
def test_a_wrong_router_still_fails_in_bf16(seed0: Path, tmp_path: Path, mutant: str):
    package = edited_copy(QWEN3_MOE, tmp_path / "qwen3_moe", ROUTER_MUTANTS[mutant])
    report = validate_model(package, seed0, dtype="bf16", steps=STEPS)
    assert not report.equivalent
    assert report.first_diverging.component == "layers.0.mlp", report.summary()
    assert report.routing["used"] == "free"
    assert not report.routing["teacher_forced"]["equivalent"]
