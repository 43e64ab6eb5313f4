"""qwen3_vl over a vocabulary the TP size does not divide (the tiny
checkpoint's 255 ids, padded to 256 in the LM head at TP=2): the reference
validates at TP=2, where ``validate_vlm`` runs it again with on-device
sampling (its ``logits (on-device sampling)`` checks); copies of its
LM-head code fail:

- ``mask dropped``: the padded columns reach the sampler unmasked, so a
  padded id could be sampled (the sampling run names the padding's id);
- ``gathered logits uncut``: the logits returned beside the sampled tokens
  keep the padding (the sampling run);
- ``returned logits uncut``: the logits of the forward without a sampler
  keep the padding. Before the width check of ``VisionPortSession`` this
  copy validated: the logits were compared over their first 255 columns
  (``metrics.component_metrics`` takes a wider port tensor for a padded
  hidden size)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autoport_cst.validate.vision_validate import validate_vlm
from tests.edited_copies import edited_copy

from .conftest import REFERENCE

MUTANTS = {
    "mask dropped": (
        "            logits = _mask_padded_vocabulary(\n"
        "                logits, self.vocab_size, self.rank if rank is None else rank\n"
        "            )\n",
        "            pass\n",
    ),
    "gathered logits uncut": (
        "            gathered_logits = gathered_logits[:, : self.vocab_size]\n",
        "",
    ),
    "returned logits uncut": (
        "            return logits[:, : self.vocab_size]\n",
        "            return logits\n",
    ),
}


def _mutant(tmp_path: Path, mutant: str) -> Path:
    old, new = MUTANTS[mutant]
    return edited_copy(REFERENCE, tmp_path / "qwen3_vl", [(old, new)])


def test_the_reference_validates_with_on_device_sampling_at_tp2(tiny_qwen3_vl: Path) -> None:
    vocab = json.loads((tiny_qwen3_vl / "config.json").read_text())["text_config"]["vocab_size"]
    assert vocab % 2 == 1
    report = validate_vlm(REFERENCE, tiny_qwen3_vl, steps=1, tp=2)
    assert report.equivalent, report.summary()
    sampled = [check for check in report.checks if check["name"] == "logits (on-device sampling)"]
    assert len(sampled) == 2 and all(check["passed"] for check in sampled), sampled


@pytest.mark.parametrize(
    ("mutant", "message"),
    [
        ("mask dropped", "handed the sampler the padded vocabulary's id(s) [255] unmasked"),
        pytest.param(
            "gathered logits uncut",
            "returned logits of 256 ids for a vocabulary of 255",
            marks=pytest.mark.slow,  # as the text references' (test_vocabulary_padding_references)
        ),
        ("returned logits uncut", "returned logits of 256 ids for a vocabulary of 255"),
    ],
)
def test_padding_reaching_the_sampler_or_the_logits_fails_at_tp2(
    tmp_path: Path, tiny_qwen3_vl: Path, mutant: str, message: str
) -> None:
    report = validate_vlm(_mutant(tmp_path, mutant), tiny_qwen3_vl, steps=1, tp=2)
    assert not report.equivalent
    assert report.failure is not None and message in report.failure, report.summary()
    sampling = "with on-device sampling at TP=2" in report.failure
    assert sampling == (mutant != "returned logits uncut"), report.failure
