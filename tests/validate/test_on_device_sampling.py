"""On-device sampling (``validate.sampled_output``; parallel_checks' ``on-device
sampling at TP=2``): the port built as the runner builds it by default,
sampling on the device, with logprobs. Before that layout no validation
built a port with a sampler, so the branch of the forward that hands the
padded vocabulary's logits to it was never run: a port that dropped the
-inf mask over the padding's ids, or the cut of the logits it returns,
validated at every default run.

Fast: each check of ``sampled_logits`` on hand-made outputs. Then the
llama3 reference on the tiny Llama (odd vocabulary, padded at TP=2)
validates with sampling, and copies of it without the mask, without the cut
or with the mask's guard inverted pass the plain TP=2 run and fail the
sampling one, naming the padding."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from autoport_cst.validate.api import _FollowUps
from autoport_cst.validate.driver import PortFailure
from autoport_cst.validate.parallel_checks import LAYOUTS
from autoport_cst.validate.sampled_output import sampled_logits
from autoport_cst.validate.standin.layers import Sampler

ROOT = Path(__file__).resolve().parents[2]
LLAMA3 = ROOT / "reference_models" / "llama3"
VOCAB, ROWS = 5, 2  # a vocabulary of 5 ids padded to 6 columns

# validations on one checkpoint share its transformers run (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("shared_reference_runs")


class _Model(nn.Module):
    def __init__(self, handed: torch.Tensor | None) -> None:
        super().__init__()
        self.sampler = Sampler()
        self.sampler.sampled_from = handed


def _logits() -> torch.Tensor:
    return torch.tensor([[0.1, -0.2, 0.3, -0.4, -0.5], [-1.0, -0.3, -0.2, -0.6, -0.9]])


def _padded(logits: torch.Tensor, fill: float = float("-inf")) -> torch.Tensor:
    return torch.cat([logits, torch.full((ROWS, 1), fill)], dim=1)


def _check(output, handed):
    return sampled_logits(output, _Model(handed), VOCAB, "decode", ROWS)


def test_masked_padding_and_the_cut_logits_pass():
    logits = _logits()
    tokens = torch.tensor([2, 2], dtype=torch.int32)
    assert torch.equal(_check((tokens, logits), _padded(logits)), logits)
    # the sampler's own output (tokens, its logits) handed on first
    assert torch.equal(_check(((tokens, _padded(logits)), logits), _padded(logits)), logits)


def test_the_samplers_own_output_is_compared_on_what_it_was_handed():
    """A forward without logprobs of its own returns the sampler's output as
    it is (deepseek_v3's): its logits are those the sampler sampled from."""
    logits = _logits()
    for fill, failure in ((float("-inf"), None), (0.0, "unmasked")):
        model = _Model(_padded(logits, fill))
        model.sampler.returned = (torch.tensor([2, 2], dtype=torch.int32), _padded(logits, fill))
        if failure is None:
            assert torch.equal(sampled_logits(model.sampler.returned, model, VOCAB, "decode", ROWS), logits)
        else:
            with pytest.raises(PortFailure, match=failure):
                sampled_logits(model.sampler.returned, model, VOCAB, "decode", ROWS)


def test_an_unmasked_padding_id_fails_though_greedy_would_not_pick_it():
    logits = _logits()  # row 0's best logit 0.3 beats the padding's 0
    with pytest.raises(PortFailure, match=r"padded vocabulary's id\(s\) \[5\] unmasked"):
        _check((torch.tensor([2, 5]), logits), _padded(logits, 0.0))


def test_logits_returned_uncut_fail():
    logits = _logits()
    with pytest.raises(PortFailure, match="logits of 6 ids for a vocabulary of 5"):
        _check((torch.tensor([2, 2]), _padded(logits)), _padded(logits))


def test_a_mask_over_a_real_id_fails():
    logits = _logits()
    handed = _padded(logits)
    handed[:, 4] = float("-inf")
    with pytest.raises(PortFailure, match=r"other logits than it returned for 1 id\(s\) .* first \[4\]"):
        _check((torch.tensor([2, 2]), logits), handed)


def test_tokens_other_than_the_greedy_choice_fail():
    logits = _logits()
    with pytest.raises(PortFailure, match="returned token 1 at sampling row 1, not the greedy sampler's 2"):
        _check((torch.tensor([2, 1]), logits), _padded(logits))


def test_no_logits_no_sampler_call_fail():
    logits = _logits()
    with pytest.raises(PortFailure, match=r"returned \[2\] last, not the logits"):
        _check((torch.tensor([2, 2]), torch.tensor([2, 2])), _padded(logits))
    with pytest.raises(PortFailure, match="called a sampler 0 times"):
        _check((torch.tensor([2, 2]), logits), None)


def test_the_sampling_layout_is_a_default_one():
    assert ("on-device sampling at TP=2", {"tp": 2, "on_device_sampling": True}) in LAYOUTS


# -- whole validations at TP=2 --------------------------------------------------------------

MUTANTS = {
    "mask dropped": (
        "            logits = _mask_padded_vocabulary(logits, self.vocab_size, lm_head_rank)\n",
        "",
    ),
    "cut dropped": ("            gathered_logits = gathered_logits[:, : self.vocab_size]\n", ""),
    "mask guard inverted": (
        "        if self.lm_head.out_features != self.vocab_size:\n",
        "        if self.lm_head.out_features == self.vocab_size:\n",
    ),
}
FAILURES = {
    "mask dropped": "padded vocabulary's id(s) [511] unmasked",
    "cut dropped": "logits of 512 ids for a vocabulary of 511",
    "mask guard inverted": "padded vocabulary's id(s) [511] unmasked",
}


def _run(package: Path, checkpoint: Path, sampling: bool):
    follow_ups = _FollowUps(package, steps=4, prompt_lengths=None, seed=0, prefill="auto")
    return follow_ups.run(checkpoint, tp=2, on_device_sampling=sampling)


def test_the_llama3_reference_validates_with_on_device_sampling(tiny_llama: Path):
    report = _run(LLAMA3, tiny_llama, sampling=True)
    assert report.equivalent, report.summary()
    assert report.settings["on_device_sampling"]


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_padding_reaching_the_sampler_or_the_logits_fails(broken_port, tiny_llama: Path, mutant: str):
    package = broken_port(*MUTANTS[mutant])
    plain = _run(package, tiny_llama, sampling=False)
    assert plain.equivalent, plain.summary()  # the runs without a sampler never take that branch
    report = _run(package, tiny_llama, sampling=True)
    assert not report.equivalent and report.exit_code == 1
    assert FAILURES[mutant] in report.failure.message, report.summary()
