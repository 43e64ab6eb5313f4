"""On-device sampling (``validate.sampled_output``; parallel_checks' ``on-device
sampling at TP=2, LM-head DP 2``): the port built as the runner builds it by
default, sampling on the device, with logprobs. Before that layout no
validation built a port with a sampler, so the branch of the forward that
hands the padded vocabulary's logits to it was never run: a port that
dropped the -inf mask over the padding's ids, or the cut of the logits it
returns, validated at every default run.

Fast: each check of ``sampled_logits`` on hand-made outputs. Then the
llama3 reference on the tiny Llama (odd vocabulary, padded at TP=2)
validates with sampling, and copies of it without the mask, without the cut
or with the mask's guard inverted pass the plain TP=2 run and fail the
sampling one, naming the padding. Copies with the mask at the wrong LM-head
rank (placed by the TP rank; the offset between the LM-head rank and the TP
rank subtracted), that hand the sampler their own LM-head-DP rows only or
that give it the TP rank (``tp_rank=self.rank``: vllm_neuron's sampler
offsets its shard's ids by the rank it is given, its place in the LM-head TP
group) validate with sampling at TP=2 without LM-head DP, where every LM-head rank
is its TP rank, and fail the default layout's LM-head DP 2."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from torch import nn

from autoport_cst.validate.api import _validate
from autoport_cst.validate.driver import PortFailure
from autoport_cst.validate.follow_ups import FollowUps
from autoport_cst.validate.parallel_checks import LAYOUTS
from autoport_cst.validate.sampled_output import _own_block, sampled_logits
from autoport_cst.validate.standin.layers import Sampler
from autoport_cst.validate.standin.neuron_config import OnDeviceSamplingConfig

ROOT = Path(__file__).resolve().parents[2]
LLAMA3 = ROOT / "reference_models" / "llama3"
VOCAB, ROWS = 5, 2  # a vocabulary of 5 ids padded to 6 columns

# validations on one checkpoint share its transformers run (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("shared_reference_runs")


class _Model(nn.Module):
    def __init__(self, handed: torch.Tensor | None) -> None:
        super().__init__()
        self.sampler = Sampler(OnDeviceSamplingConfig())
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


def test_a_tuple_in_place_of_the_tokens_fails():
    """vllm_neuron's sampler returns the token ids only: a forward handing on
    a (tokens, logits) pair first, or returning only the sampler's output,
    returns no tokens, or no logits, of its own (the stand-in's Sampler
    returned such a pair until it took vllm_neuron's interface)."""
    logits = _logits()
    tokens = torch.tensor([2, 2], dtype=torch.int32)
    with pytest.raises(PortFailure, match="sampled tokens are tuple"):
        _check(((tokens, _padded(logits)), logits), _padded(logits))
    with pytest.raises(PortFailure, match=r"returned Tensor, not \(sampled tokens, ..., logits\)"):
        _check(tokens, _padded(logits))


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
    with pytest.raises(
        PortFailure, match=r"returned token 1 at sampling row 1, not the sampler's 2 \(greedy\)"
    ):
        _check((torch.tensor([2, 1]), logits), _padded(logits))


def test_no_logits_no_sampler_call_fail():
    logits = _logits()
    with pytest.raises(PortFailure, match=r"returned \[2\] last, not the logits"):
        _check((torch.tensor([2, 2]), torch.tensor([2, 2])), _padded(logits))
    with pytest.raises(PortFailure, match="called a sampler 0 times"):
        _check((torch.tensor([2, 2]), logits), None)


def test_every_lm_head_dp_rows_handed_are_checked_and_cut_to_this_ranks():
    """With LM-head DP 2 the sampler is handed both LM-head-DP ranks' rows
    (``2 * ROWS``): the padding is checked on all of them, the rest on this
    rank's block (its place in the LM-head DP group)."""
    logits, theirs = _logits(), _logits() + 1.0
    both = torch.cat([_padded(theirs), _padded(logits)])
    assert torch.equal(_own_block(both, VOCAB, "decode", ROWS, (2, 1)), _padded(logits))
    model = _Model(both)
    tokens = torch.tensor([2, 2], dtype=torch.int32)
    assert torch.equal(sampled_logits((tokens, logits), model, VOCAB, "decode", ROWS, (2, 1)), logits)
    with pytest.raises(PortFailure, match="other logits than it returned"):  # rank 0's block is theirs
        sampled_logits((tokens, logits), model, VOCAB, "decode", ROWS, (2, 0))
    unmasked = torch.cat([_padded(theirs, 0.0), _padded(logits)])  # the other rank's padding
    with pytest.raises(PortFailure, match=r"padded vocabulary's id\(s\) \[5\] unmasked"):
        sampled_logits((tokens, logits), _Model(unmasked), VOCAB, "decode", ROWS, (2, 1))


def test_own_rows_handed_at_lm_head_dp_2_name_the_rows():
    """This rank's rows alone, sharded over the LM-head TP group, reach the
    sampler beside other replicas' columns: the message says why."""
    logits = _logits()
    mixed = _padded(logits)
    mixed[:, 3:] = torch.cat([(logits + 1.0)[:, 3:], torch.full((ROWS, 1), float("-inf"))], dim=1)
    with pytest.raises(PortFailure, match="with LM-head DP 2 the sampler reduces over the LM-head TP group"):
        sampled_logits((torch.tensor([2, 2]), logits), _Model(mixed), VOCAB, "decode", ROWS, (2, 0))


def test_the_sampling_layout_is_a_default_one():
    layout = (
        "on-device sampling at TP=2, LM-head DP 2",
        {"tp": 2, "lm_head_dp": 2, "on_device_sampling": True},
    )
    assert layout in LAYOUTS


# -- whole validations at TP=2 --------------------------------------------------------------

MUTANTS = {
    "mask dropped": (
        "            logits = _mask_padded_vocabulary(logits, self.vocab_size, lm_head_rank)\n",
        "            pass\n",
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
CALL = "        sampled_tokens = self.sampler(logits, sampling_params, logit_mask=logit_mask, tp_rank=lm_head_rank)\n"
# the vocabulary of 511 padded to 512 over the 4 ranks of the LM-head TP group at TP=2 with
# LM-head DP 2 (the supergroup of two replicas' TP groups): id 511 is on LM-head rank 3, TP rank 1
LM_HEAD_DP_MUTANTS = {
    "mask at the TP rank": (
        "        lm_head_rank = self.lm_head_tp_group.rank_in_group\n",
        "        lm_head_rank = self.rank\n",
    ),
    "LM-head rank offset subtracted": (
        "lm_head_rank = rank + (lm_head_rank - self.rank)",
        "lm_head_rank = rank - (lm_head_rank - self.rank)",
    ),
    # the reference before 'on-device sampling at TP=2, LM-head DP 2' found it: each rank samples
    # its own rows, which its LM-head TP group's ranks of the other replica do not hold
    "own rows sampled": (
        "        if self.lm_head_dp_size > 1 and sampling_params is not None:\n"
        "            sampling_params = self.lm_head_dp_group.all_gather(sampling_params, dim=0)\n"
        "        if self.lm_head_dp_size > 1 and logit_mask is not None:\n"
        "            logit_mask = self.lm_head_dp_group.all_gather(logit_mask, dim=0)\n"
        "        sampled_tokens = self.sampler(logits, sampling_params, logit_mask=logit_mask, tp_rank=lm_head_rank)\n"
        "        if self.lm_head_dp_size > 1:\n"
        "            sampled_tokens = _own_rows(sampled_tokens, own_rows)\n",
        "        sampled_tokens = self.sampler(logits[own_rows], sampling_params, logit_mask=logit_mask, tp_rank=rank)\n",
    ),
    # vllm_neuron's sampler offsets its shard's ids by the rank it is given (its distributed
    # top-k): the TP rank puts LM-head ranks 2 and 3 at ids 0 and 128, not 256 and 384
    "sampler given the TP rank": ("tp_rank=lm_head_rank)", "tp_rank=rank)"),
    # the runner's logit mask cut to this shard by the port at the runner's TP rank: LM-head
    # ranks 2 and 3 take the columns of ids 0-255 (validated before the run drove a mask)
    "logit mask cut at the TP rank": (
        CALL,
        "        if logit_mask is not None:\n"
        "            width = logits.shape[-1]\n"
        "            logit_mask = logit_mask[:, rank * width : (rank + 1) * width]\n" + CALL,
    ),
}
# (patterns) ranks 2 and 3 of the second replica both fail: whichever reports first names the run
LM_HEAD_DP_FAILURES = {
    "mask at the TP rank": re.escape(
        "the decode forward handed the sampler the padded vocabulary's id(s) [511] unmasked"
    ),
    # LM-head ranks 2 and 3 (TP ranks 0 and 1) give -2 and -1: the sampler cannot slice the
    # runner's logit mask there
    "LM-head rank offset subtracted": "rank [23]: .*tp_rank -[12] selects no shard of a logit_mask of 512 columns",
    "own rows sampled": "with LM-head DP 2 the sampler reduces over the LM-head TP group",
    "sampler given the TP rank": "the sampler was given tp_rank [01] on rank [23] of its group of 4",
    "logit mask cut at the TP rank": "the decode forward returned token",
}
# the runner's requests (sampled_output.runner_sampling: sampling parameters per row, a logit
# mask) not reaching the sampler as the runner gave them; each validated while the run asked
# for greedy rows without a mask, but "sampling params not gathered" (refused for its shape)
REQUEST_MUTANTS = {
    "logit mask rows not gathered": (
        "        if self.lm_head_dp_size > 1 and logit_mask is not None:\n"
        "            logit_mask = self.lm_head_dp_group.all_gather(logit_mask, dim=0)\n",
        "",
    ),
    "greedy params made by the port": (
        CALL,
        CALL.replace("sampling_params,", "torch.tensor([[-1.0, 1.0, 0.0]]).repeat(logits.shape[0], 1),"),
    ),
    "logit mask dropped": (CALL, CALL.replace("logit_mask=logit_mask", "logit_mask=None")),
    "sampling params not gathered": (
        "        if self.lm_head_dp_size > 1 and sampling_params is not None:\n"
        "            sampling_params = self.lm_head_dp_group.all_gather(sampling_params, dim=0)\n",
        "",
    ),
}
REQUEST_FAILURES = {
    "logit mask rows not gathered": "The size of tensor a (3) must match the size of tensor b (6)",
    "greedy params made by the port": "not the sampler's",
    "logit mask dropped": "not the sampler's",
    "sampling params not gathered": "sampling_params of shape [3, 3] for 6 row(s)",
}
SAMPLING = dict(LAYOUTS)["on-device sampling at TP=2, LM-head DP 2"]


def _run(package: Path, checkpoint: Path, sampling: bool, lm_head_dp: int = 1):
    follow_ups = FollowUps(package, steps=4, prompt_lengths=None, seed=0, prefill="auto", validate=_validate)
    return follow_ups.run(checkpoint, tp=2, on_device_sampling=sampling, lm_head_dp=lm_head_dp)


def _run_default_sampling(package: Path, checkpoint: Path):
    follow_ups = FollowUps(package, steps=4, prompt_lengths=None, seed=0, prefill="auto", validate=_validate)
    return follow_ups.run(checkpoint, **SAMPLING)


def test_the_llama3_reference_validates_with_on_device_sampling(tiny_llama: Path):
    for report in (_run(LLAMA3, tiny_llama, sampling=True), _run_default_sampling(LLAMA3, tiny_llama)):
        assert report.equivalent, report.summary()
        assert report.settings["on_device_sampling"]


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_padding_reaching_the_sampler_or_the_logits_fails(broken_port, tiny_llama: Path, mutant: str):
    package = broken_port(*MUTANTS[mutant])
    plain = _run(package, tiny_llama, sampling=False)
    assert plain.equivalent, plain.summary()  # the runs without a sampler never take that branch
    report = _run_default_sampling(package, tiny_llama)
    assert not report.equivalent and report.exit_code == 1
    assert FAILURES[mutant] in report.failure.message, report.summary()


@pytest.mark.parametrize("mutant", sorted(LM_HEAD_DP_MUTANTS))
def test_the_wrong_lm_head_rank_fails_at_lm_head_dp_2(broken_port, tiny_llama: Path, mutant: str):
    package = broken_port(*LM_HEAD_DP_MUTANTS[mutant])
    # at TP=2 alone every LM-head rank is its TP rank and each rank samples its own rows
    at_tp2 = _run(package, tiny_llama, sampling=True)
    assert at_tp2.equivalent, at_tp2.summary()
    report = _run_default_sampling(package, tiny_llama)
    assert not report.equivalent and report.exit_code == 1
    assert re.search(LM_HEAD_DP_FAILURES[mutant], report.failure.message), report.summary()


# "sampling params not gathered" failed before the run drove requests (their shape): slow
REQUEST_CASES = [
    pytest.param(name, marks=pytest.mark.slow) if name == "sampling params not gathered" else name
    for name in sorted(REQUEST_MUTANTS)
]


@pytest.mark.parametrize("mutant", REQUEST_CASES)
def test_the_runners_requests_reach_the_sampler_as_given(broken_port, tiny_llama: Path, mutant: str):
    """The sampling run hands each row a request (greedy, top-k 1 at a
    temperature, draws at 0.5 under top-k / top-p) and a logit mask over the
    padded vocabulary; the returned tokens must be the sampler's choice with
    them. A port that replaces them, drops the mask, or hands the LM-head TP
    group one replica's rows of them fails."""
    package = broken_port(*REQUEST_MUTANTS[mutant])
    report = _run_default_sampling(package, tiny_llama)
    assert not report.equivalent and report.exit_code == 1
    assert REQUEST_FAILURES[mutant] in report.failure.message, report.summary()
