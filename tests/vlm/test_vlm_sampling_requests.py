"""qwen3_vl's on-device sampling run (``validate_vlm`` at TP=2) hands each
sampling row the runner's request and a logit mask
(``sampled_output.runner_sampling``), as the text runs do: the sampled
tokens must be the sampler's choice with them. A copy of the reference that
hands its sampler greedy parameters of its own and no mask validated while
the run asked greedy rows without a mask (measured before this change); it fails
now, naming the row's request. The reference itself validates there
(``test_vocabulary_padding_vlm.py``)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from autoport_cst.validate.vision_validate import validate_vlm

from .conftest import REFERENCE

CALL = "self.sampler(logits, sampling_params, logit_mask=logit_mask, tp_rank=rank)"
IGNORED = (
    "self.sampler(logits, torch.tensor([[-1.0, 1.0, 0.0]]).repeat(logits.shape[0], 1), "
    "logit_mask=None, tp_rank=rank)"
)


@pytest.mark.slow
def test_a_sampler_call_ignoring_the_runners_requests_fails(tmp_path: Path, tiny_qwen3_vl: Path) -> None:
    directory = tmp_path / "qwen3_vl"
    shutil.copytree(REFERENCE, directory, ignore=shutil.ignore_patterns("__pycache__"))
    model = directory / "model.py"
    text = model.read_text(encoding="utf-8")
    assert text.count(CALL) == 1, "the sampler call is not in the reference once"
    model.write_text(text.replace(CALL, IGNORED), encoding="utf-8")
    report = validate_vlm(directory, tiny_qwen3_vl, steps=1, tp=2)
    assert not report.equivalent
    assert "with on-device sampling at TP=2" in report.summary(), report.summary()
    assert "not the sampler's" in report.summary(), report.summary()
