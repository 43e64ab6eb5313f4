"""The bf16 smoke test's checks (serve/bf16_checks.py): served bf16 logits
judged by validate's bf16 logit gates, teacher-forced along the served
tokens; a correct bf16 run passes where its tokens legitimately differ, a
wrong one fails."""

from __future__ import annotations

import torch

from autoport_cst.serve.battery import Completion
from autoport_cst.serve.bf16_checks import bf16_logit_checks

VOCAB = 64


class _Reference:
    """fp32 logits, and the same rounded through bfloat16 with the error of a
    bf16 run (transformers' own)."""

    def __init__(self) -> None:
        self.generator = torch.Generator().manual_seed(0)
        self.rows: dict[tuple[int, ...], tuple[torch.Tensor, torch.Tensor]] = {}

    def logits(self, prompt, served):
        key = tuple(prompt)
        if key not in self.rows:
            f = torch.randn(len(served), VOCAB, generator=self.generator) * 3
            b = f + torch.randn(f.shape, generator=self.generator) * 0.03
            self.rows[key] = (f, b)
        return self.rows[key]


def _served(reference, error):
    served = []
    for i in range(4):
        completion = Completion(f"offline[{i}]", "p", [1, 2, 3 + i], [0] * 8, "")
        f, _ = reference.logits(completion.prompt_token_ids, completion.token_ids)
        t = error(f)
        completion.token_ids = [int(token) for token in t.argmax(-1)]
        served.append((completion, t))
    return served


def test_a_run_with_errors_of_bf16_size_passes_every_gate():
    reference = _Reference()
    generator = torch.Generator().manual_seed(1)
    served = _served(reference, lambda f: f + torch.randn(f.shape, generator=generator) * 0.025)
    checks = bf16_logit_checks("offline", served, reference)
    assert {check.name.rsplit(" ", 1)[-1] for check in checks} >= {"three_way", "cosine", "greedy_match"}
    assert all(check.passed for check in checks), [(c.name, c.detail) for c in checks]


def test_a_run_with_errors_far_above_bf16_fails():
    reference = _Reference()
    generator = torch.Generator().manual_seed(1)
    served = _served(reference, lambda f: f + torch.randn(f.shape, generator=generator) * 0.5)
    failed = [check.name for check in bf16_logit_checks("offline", served, reference) if not check.passed]
    assert any("three_way" in name for name in failed), failed
