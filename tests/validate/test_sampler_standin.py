"""The stand-in ``Sampler`` and ``OnDeviceSamplingConfig`` against
vllm_neuron's: ``Sampler.forward`` returns the sampled token ids only (int32
``[N]``, what ``vllm_neuron.functional.sample`` returns), not a tuple with
logits; it needs its sampling config and uses ``tp_rank`` where vllm_neuron's
does (the padding mask, a logit mask wider than the shard, the distributed
top-k's id offset), refusing those calls without it; it samples greedily
only where vllm_neuron's would (``all_greedy``, or the runner's
``sampling_params`` at temperature 0: called without them, vllm_neuron draws
at temperature 1.0); the config has vllm_neuron's fields (``all_greedy``,
``max_top_k``, ``deterministic``, ``sampling_dp_degree``, ``capture_topk``).
The stand-in returned ``(tokens, logits)`` and sampled greedily whatever it
was given, so a port that returned the sampler's output as its logprobs or
dropped the runner's sampling parameters validated.

Fast: the sampler's calls. Then a copy of the llama3 reference that hands the
sampler no sampling parameters fails the on-device sampling run (TP=2; the
reference itself validates there: test_on_device_sampling.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from autoport_cst.validate.api import _validate
from autoport_cst.validate.driver import PortFailure
from autoport_cst.validate.follow_ups import FollowUps
from autoport_cst.validate.sampled_output import sampled_logits
from autoport_cst.validate.standin import neuron_config as nc
from autoport_cst.validate.standin.collectives import LOCAL_GROUP
from autoport_cst.validate.standin.layers import Sampler, greedy_sampling_params

ROOT = Path(__file__).resolve().parents[2]
LLAMA3 = ROOT / "reference_models" / "llama3"

pytestmark = pytest.mark.usefixtures("shared_reference_runs")


def _logits() -> torch.Tensor:
    return torch.tensor([[0.1, -0.2, 0.3, -0.4, -0.5], [-1.0, -0.3, -0.2, -0.6, -0.9]])


def test_the_sampler_returns_the_token_ids_only():
    tokens = Sampler(nc.OnDeviceSamplingConfig())(_logits(), greedy_sampling_params(2))
    assert isinstance(tokens, torch.Tensor)
    assert tokens.dtype == torch.int32
    assert tokens.tolist() == [2, 2]


def test_without_sampling_params_only_all_greedy_samples():
    with pytest.raises(ValueError, match="without sampling_params and all_greedy off"):
        Sampler(nc.OnDeviceSamplingConfig())(_logits())
    assert Sampler(nc.OnDeviceSamplingConfig(all_greedy=True))(_logits()).tolist() == [2, 2]


def test_a_random_draw_or_a_wrong_shape_is_refused():
    """A row at a temperature among several candidates draws at a random
    point unless the config is deterministic: the stand-in cannot know it."""
    hot = greedy_sampling_params(2)
    hot[1, 2] = 0.7
    with pytest.raises(
        NotImplementedError, match=r"cannot draw at random: row\(s\) \[1\] .* temperature 0.7"
    ):
        Sampler(nc.OnDeviceSamplingConfig())(_logits(), hot)
    with pytest.raises(ValueError, match=r"sampling_params of shape \[1, 3\] for 2 row"):
        Sampler(nc.OnDeviceSamplingConfig())(_logits(), greedy_sampling_params(1))


def _params(*rows: tuple[float, float, float]) -> torch.Tensor:
    return torch.tensor(rows)


def test_sampling_as_vllm_neurons_sample():
    """Row 0's logits sorted: ids 2, 0, 1, 3, 4 (0.3, 0.1, -0.2, -0.4, -0.5);
    at temperature 1 their probabilities are 0.297, 0.243, 0.180, 0.147,
    0.133, whose cumulative sum passes 0.5 at id 0: a deterministic draw
    (at 0.5) returns id 0, where greedy returns id 2. Top-k 1, a top-p below
    the first probability or a low temperature leave id 2; top-k 3 at
    temperature 1 renormalizes 0.297, 0.243, 0.180 (cumulative 0.41, 0.75):
    id 0. Top-k 1 needs no deterministic config (one candidate)."""
    deterministic = Sampler(nc.OnDeviceSamplingConfig(deterministic=True))
    row = _logits()[:1]
    expected = {
        (-1.0, 1.0, 0.0): 2,
        (-1.0, 1.0, 1.0): 0,
        (1.0, 1.0, 1.0): 2,
        (-1.0, 0.25, 1.0): 2,
        (-1.0, 1.0, 0.1): 2,
        (3.0, 1.0, 1.0): 0,
        (2.0, 0.5, 1.0): 2,
    }
    for request, token in expected.items():
        assert deterministic(row, _params(request)).tolist() == [token], request
        assert deterministic.choice(row, _params(request), None).tolist() == [token], request
    assert Sampler(nc.OnDeviceSamplingConfig())(row, _params((1.0, 1.0, 0.7))).tolist() == [2]
    # without sampling_params a deterministic sampler draws every row at temperature 1.0
    assert deterministic(row).tolist() == [0]


def test_the_candidates_are_capped_by_max_top_k():
    """vllm_neuron's top-k keeps min(max_top_k, shard width) candidates:
    with max_top_k 2, ids 2 and 0 (probabilities 0.55, 0.45 at temperature
    1): the draw at 0.5 returns id 2."""
    sampler = Sampler(nc.OnDeviceSamplingConfig(deterministic=True, max_top_k=2))
    assert sampler(_logits()[:1], _params((-1.0, 1.0, 1.0))).tolist() == [2]
    assert sampler.cap == 2


def test_a_logit_mask_changes_what_a_drawn_row_returns():
    """The mask applies before the top-k: without id 2, row 0's candidates
    are ids 0, 1, 3, 4 and greedy returns id 0, the draw at 0.5 id 1."""
    sampler = Sampler(nc.OnDeviceSamplingConfig(deterministic=True))
    mask = torch.ones(1, 5, dtype=torch.bool)
    mask[0, 2] = False
    assert sampler(_logits()[:1], _params((-1.0, 1.0, 0.0)), logit_mask=mask).tolist() == [0]
    assert sampler(_logits()[:1], _params((-1.0, 1.0, 1.0)), logit_mask=mask).tolist() == [1]
    assert sampler.choice(_logits()[:1], _params((-1.0, 1.0, 1.0)), mask).tolist() == [1]


def test_given_the_vocabulary_the_sampler_masks_its_padding():
    """vllm_neuron's Sampler(..., vocab_size=) sets the padded ids to -inf
    itself: the padding it was handed at 0 (above every real logit of row 1)
    is not sampled, and what it samples from has it at -inf."""
    padded = torch.cat([_logits(), torch.zeros(2, 1)], dim=1)
    sampler = Sampler(nc.OnDeviceSamplingConfig(), vocab_size=5)
    assert sampler(padded, greedy_sampling_params(2)).tolist() == [2, 2]
    assert torch.isneginf(sampler.sampled_from[:, 5]).all()
    assert Sampler(nc.OnDeviceSamplingConfig())(padded, greedy_sampling_params(2)).tolist() == [2, 5]


def test_the_logit_mask_is_boolean():
    mask = torch.ones(2, 5, dtype=torch.bool)
    mask[:, 2] = False
    sampler = Sampler(nc.OnDeviceSamplingConfig())
    assert sampler(_logits(), greedy_sampling_params(2), logit_mask=mask).tolist() == [0, 1]
    with pytest.raises(TypeError, match="logit_mask must be bool"):
        sampler(_logits(), greedy_sampling_params(2), logit_mask=mask.to(torch.int32))


def test_the_sampler_needs_its_config():
    """vllm_neuron's Sampler reads all_greedy, max_top_k, deterministic and
    capture_topk from its config at construction."""
    with pytest.raises(TypeError, match="reads its sampling_config"):
        Sampler(None)
    with pytest.raises(TypeError):
        Sampler()  # type: ignore[call-arg]


def test_the_padding_mask_is_placed_at_the_rank_given():
    """Over a process group the padding mask needs ``tp_rank`` (a tensor):
    its shard's ids start at ``tp_rank * width``. Rank 1 of a shard of 6
    columns holds ids 6-11, every one past the vocabulary of 5."""
    padded = torch.cat([_logits(), torch.zeros(2, 1)], dim=1)
    sampler = Sampler(nc.OnDeviceSamplingConfig(), process_group=LOCAL_GROUP, vocab_size=5)
    params = greedy_sampling_params(2)
    with pytest.raises(ValueError, match="tp_rank must be provided for masking padded vocabulary"):
        sampler(padded, params)
    with pytest.raises(TypeError, match="tp_rank must be a tensor"):
        sampler(padded, params, tp_rank=0)
    assert sampler(padded, params, tp_rank=torch.tensor(0, dtype=torch.int32)).tolist() == [2, 2]
    assert sampler.sampled_from[:, 5].isneginf().all() and sampler.rank_used == [0]
    sampler(padded, params, tp_rank=torch.tensor(1, dtype=torch.int32))
    assert sampler.sampled_from.isneginf().all() and sampler.rank_used == [1]


def test_a_logit_mask_one_shard_wide_or_sliced_at_the_rank_given():
    """A mask as wide as the shard is taken as it is (no tp_rank needed); a
    wider one, divisible into shards, is sliced at ``tp_rank``."""
    sampler = Sampler(nc.OnDeviceSamplingConfig(), process_group=LOCAL_GROUP)
    params = greedy_sampling_params(2)
    shard = torch.ones(2, 5, dtype=torch.bool)
    shard[:, 2] = False
    assert sampler(_logits(), params, logit_mask=shard).tolist() == [0, 1]
    full = torch.cat([torch.ones(2, 5, dtype=torch.bool), shard], dim=1)  # shard 1 is `shard`
    with pytest.raises(ValueError, match="tp_rank must be provided for a logit_mask wider"):
        sampler(_logits(), params, logit_mask=full)
    assert sampler(_logits(), params, logit_mask=full, tp_rank=torch.tensor(0)).tolist() == [2, 2]
    assert sampler(_logits(), params, logit_mask=full, tp_rank=torch.tensor(1)).tolist() == [0, 1]
    with pytest.raises(ValueError, match="divisible by the shard's: 7 by 5"):
        sampler(_logits(), params, logit_mask=full[:, :7], tp_rank=torch.tensor(0))


def test_the_config_has_vllm_neurons_fields():
    config = nc.NeuronConfig.from_dict(
        {"on_device_sampling_config": {"all_greedy": True, "max_top_k": 8, "global_topk": 3}}
    ).on_device_sampling_config
    assert (config.all_greedy, config.max_top_k, config.deterministic) == (True, 8, False)
    assert (config.sampling_dp_degree, config.capture_topk) == (1, False)
    assert not hasattr(config, "global_topk") and not hasattr(config, "do_sample")


def test_a_forward_returning_the_samplers_output_as_it_is_has_no_logits():
    """With logprobs asked for, vllm_neuron's models return (tokens,
    gathered logits); the sampler's own output is the tokens alone."""

    class _Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.sampler = Sampler(nc.OnDeviceSamplingConfig())

    model = _Model()
    tokens = model.sampler(_logits(), greedy_sampling_params(2))
    with pytest.raises(PortFailure, match="returned Tensor, not \\(sampled tokens, ..., logits\\)"):
        sampled_logits(tokens, model, 5, "decode", 2)
    assert torch.equal(sampled_logits((tokens, _logits()), model, 5, "decode", 2), _logits())


# -- whole validations at TP=2 --------------------------------------------------------------


def _sampling_run(package: Path, checkpoint: Path):
    follow_ups = FollowUps(package, steps=4, prompt_lengths=None, seed=0, prefill="auto", validate=_validate)
    return follow_ups.run(checkpoint, tp=2, on_device_sampling=True)


def test_a_port_that_drops_the_sampling_params_fails_the_sampling_run(tmp_path, tiny_llama):
    mutant = tmp_path / "llama3"
    shutil.copytree(LLAMA3, mutant)
    source = (mutant / "model.py").read_text()
    call = "self.sampler(logits, sampling_params, logit_mask=logit_mask, tp_rank=lm_head_rank)"
    assert source.count(call) == 1
    (mutant / "model.py").write_text(source.replace(call, call.replace("sampling_params,", "None,")))
    report = _sampling_run(mutant, tiny_llama)
    assert not report.equivalent
    # the run's sampling config is deterministic: without them the sampler draws every row at
    # temperature 1.0 (at 0.5), not what the runner asked
    assert "not the sampler's" in report.failure.message, report.summary()
