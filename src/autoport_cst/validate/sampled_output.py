"""On-device sampling: what a port hands the sampler and returns when it
samples on the device, checked in a validation run that asks for it
(``Scenario.on_device_sampling``: the ``on-device sampling at TP=2`` layout
of ``parallel_checks``).

vllm_neuron's runner samples on the device by default (the NeuronConfig's
``on_device_sampling_config``): the port's forward hands its logits to the
sampler and returns what the sampler returned (the sampled token ids,
first: vllm_neuron's ``Sampler`` returns nothing else) and, when logprobs are
asked for (``max_logprobs`` not 0), the logits it gathers itself, last:
``(tokens, ..., logits)``.
The runs without sampling never take that branch of the port's forward.

The LM head computes a vocabulary padded to a multiple of its TP size (a
``ColumnParallelLinear`` shards evenly; the last shard ends in zero rows):
the padding's columns, ids from ``vocab_size`` on, are ids the tokenizer
does not have. A sampler handed them can return one (greedy, as soon as
every real logit of a row is below the padding's zero), so they must reach
it at -inf; and the logits returned must be cut to ``vocab_size``. Whether a
greedy choice happens to land on the padding depends on the weights, so the
check is on what the sampler was handed (the stand-in's ``Sampler`` keeps
it: ``sampled_from``), every forward:

- every padding id at -inf, never sampled;
- every id of the vocabulary with the logit the forward returns for it, the
  same numbers (the port computes both from one LM-head output: a mask over
  the wrong columns hides real ids);
- the tokens returned are the sampler's choice over those logits, with the
  runner's sampling parameters and logit mask of each row (``runner_sampling``);
- the logits returned have ``vocab_size`` columns, one row per sampling
  position; the validation compares them with transformers' as in any run
  (a forward that returns the sampler's output as it is returns no logits).

With LM-head data parallelism (``lm_head_dp`` k > 1: the layout runs at TP=2
with LM-head DP 2) the LM head is sharded over TP x k ranks, k replicas'
batches, and the sampler reduces over that group: each rank must hand it the
same rows, every replica's (k x its own, gathered), and keep its own tokens
(the ``k``-th block of rows, its LM-head DP rank's). A rank that hands it only
its own rows hands it columns of other replicas' rows: the real ids then
differ from the logits it returns. Only there the padded tail of the
vocabulary sits on an LM-head rank that is not the TP rank (at TP=2 with
LM-head DP 2 the padding is on LM-head rank 3, TP rank 1): a mask placed by
the TP rank, or with the sign of the offset between the two ranks flipped,
leaves it unmasked. The rows' requests and logit masks (``runner_sampling``)
differ between the replicas, so they must reach the sampler gathered alike,
and the mask's columns at the LM-head rank (the sampler slices it by the rank
it is given; a port that cuts it at the TP rank masks other ids).
"""

from __future__ import annotations

from typing import Any

import torch

from .port_failure import PortFailure

LOGPROBS = 1  # max_logprobs of the sampling run: the forward returns the logits beside the tokens


# the runner's requests of a sampling run, chosen per row (``runner_sampling``): (top_k, top_p,
# temperature): greedy; top-k 1 at a temperature (one candidate: the same token at any random
# point); top-k 8 with top-p 0.9 and top-k off with top-p 0.6 at temperatures, drawn at 0.5
# (the sampling config is deterministic)
REQUESTS = ((-1.0, 1.0, 0.0), (1.0, 1.0, 0.7), (8.0, 0.9, 1.0), (-1.0, 0.6, 0.8))
ALLOWED = 0.5  # the share of the vocabulary each row's logit mask allows


def sampling_config() -> Any:
    """The sampling config of a run with on-device sampling: vllm_neuron's
    defaults (not all-greedy: every call goes through the distributed top-k),
    deterministic, so that a row sampled at a temperature draws at 0.5."""
    from .standin import neuron_config as nc

    return nc.OnDeviceSamplingConfig(deterministic=True)


def sampling_neuron_config(**sizes: Any) -> Any:
    """The stand-in NeuronConfig of a run with on-device sampling
    (``sampling_config``) and logprobs, with the given layout fields."""
    from .standin import neuron_config as nc

    return nc.NeuronConfig(max_logprobs=LOGPROBS, on_device_sampling_config=sampling_config(), **sizes)


def runner_sampling(
    input_ids: torch.Tensor, positions: torch.Tensor, sampling_positions: torch.Tensor, width: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The runner's ``sampling_params`` ``[rows, 3]`` and ``logit_mask``
    ``[rows, width]`` (bool, True = allowed) of a forward's sampling rows.
    Each row's are drawn from a generator seeded by the row's position and
    token, so that every rank holding a row hands the same, and rows of
    different sequences (other replicas' under DP) differ: a request of
    ``REQUESTS`` and a mask allowing about half the ids. ``width`` is the
    LM head's padded vocabulary (``mask_width``), which the sampler slices by
    the rank it is given."""
    params, masks = [], []
    for row in sampling_positions.tolist():
        seed = int(positions[row]) * 1_000_003 + int(input_ids[row]) + 7
        generator = torch.Generator().manual_seed(seed)
        kind = int(torch.randint(len(REQUESTS), (1,), generator=generator))
        params.append(REQUESTS[kind])
        masks.append(torch.rand(width, generator=generator) < ALLOWED)
    return torch.tensor(params), torch.stack(masks)


def mask_width(model: Any, vocab_size: int) -> int:
    """The width of the runner's logit mask: the model's padded vocabulary
    (its ``lm_head``'s ``out_features``), else the vocabulary padded to a
    multiple of the LM-head TP group's size."""
    width = getattr(getattr(model, "lm_head", None), "out_features", None)
    if isinstance(width, int) and width >= vocab_size:
        return width
    from .standin import parallel_state

    shards = parallel_state.get_neuron_lm_head_tp_group().world_size
    return -(-vocab_size // shards) * shards


def _samplers(model: Any) -> list[Any]:
    from .standin.layers import Sampler

    return [module for module in model.modules() if isinstance(module, Sampler)]


def forget_sampled(model: Any) -> None:
    """Clear what the model's samplers were handed (before each forward)."""
    for sampler in _samplers(model):
        sampler.sampled_from = None


def lm_head_dp() -> tuple[int, int]:
    """(size, this rank's place) of the active layout's LM-head DP group."""
    from .standin import parallel_state

    group = parallel_state.get_neuron_lm_head_dp_group()
    return group.world_size, group.rank_in_group


def sampled_logits(
    output: Any,
    model: Any,
    vocab_size: int,
    stage: str,
    rows: int,
    dp: tuple[int, int] = (1, 0),
    requests: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """The logits of a forward with on-device sampling, after the checks of
    the module docstring; ``PortFailure`` naming the first that fails.
    ``dp``: the LM-head DP group's (size, this rank's place) (``lm_head_dp``);
    ``requests``: the ``sampling_params`` and ``logit_mask`` of this rank's
    rows the forward was given (``runner_sampling``; None: greedy, no mask)."""
    called = [s for s in _samplers(model) if s.sampled_from is not None]
    if len(called) != 1:
        raise PortFailure(
            stage,
            f"with on-device sampling the {stage} forward called a sampler {len(called)} times, not once",
        )
    sampler = called[0]
    handed = _own_block(sampler.sampled_from, vocab_size, stage, rows, dp)
    tokens, logits = _tokens_and_logits(output, stage, rows, vocab_size)
    _check_handed(handed, logits, vocab_size, stage, dp[0])
    params, mask = requests if requests is not None else (None, None)
    chosen = sampler.choice(logits, params, mask)
    if tokens.shape != chosen.shape:
        raise PortFailure(
            stage,
            f"the {stage} forward returned {list(tokens.shape)} sampled tokens for {rows} sampling "
            "position(s): one per position of this rank",
        )
    if not torch.equal(tokens.to(torch.int64), chosen):
        row = int((tokens.to(torch.int64) != chosen).nonzero()[0])
        raise PortFailure(
            stage,
            f"the {stage} forward returned token {int(tokens[row])} at sampling row {row}, not the "
            f"sampler's {int(chosen[row])} ({_request(params, mask, row)}){_rank_hint(sampler)}",
        )
    return logits


def _request(params: torch.Tensor | None, mask: torch.Tensor | None, row: int) -> str:
    """What the runner asked of a row, in words."""
    if params is None:
        asked = "greedy"
    else:
        top_k, top_p, temperature = (float(v) for v in params[row])
        asked = f"top_k {top_k:g}, top_p {top_p:g}, temperature {temperature:g}"
    if mask is not None:
        asked += f", a logit_mask allowing {int(mask[row].sum())} of its {mask.shape[-1]} ids"
    return asked


def _rank_hint(sampler: Any) -> str:
    """Why, when a shard of the sampler's group was given another rank than
    its place: vllm_neuron's sampler offsets the shard's ids by it."""
    given = sampler.rank_used or []
    wrong = [place for place, rank in enumerate(given) if rank != place]
    if not wrong:
        return ""
    return (
        f" (the sampler was given tp_rank {given[wrong[0]]} on rank {wrong[0]} of its group of {len(given)}: "
        "vllm_neuron's sampler takes a shard's ids, padding and logit_mask columns from the rank it is "
        "given, its place in the sampler's process group: with LM-head DP the LM-head TP group's)"
    )


def _tokens_and_logits(
    output: Any, stage: str, rows: int, vocab_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The sampled tokens (first) and the logits (last) a forward returned."""
    if not isinstance(output, (tuple, list)) or len(output) < 2:
        raise PortFailure(
            stage,
            f"with on-device sampling and logprobs the {stage} forward returned {type(output).__name__}, "
            "not (sampled tokens, ..., logits)",
        )
    tokens, logits = output[0], output[-1]
    if not isinstance(tokens, torch.Tensor) or tokens.is_floating_point() or list(tokens.shape) != [rows]:
        shape = list(tokens.shape) if isinstance(tokens, torch.Tensor) else type(tokens).__name__
        raise PortFailure(
            stage, f"the {stage} forward's sampled tokens are {shape}: one integer id per sampling position"
        )
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2 or logits.shape[0] != rows:
        shape = list(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise PortFailure(
            stage,
            f"with logprobs asked for (max_logprobs {LOGPROBS}) the {stage} forward returned {shape} "
            f"last, not the logits of its {rows} sampling position(s)",
        )
    if logits.shape[1] != vocab_size:
        raise PortFailure(
            stage,
            f"the {stage} forward returned logits of {logits.shape[1]} ids for a vocabulary of {vocab_size}: "
            "the LM head's padded vocabulary must be cut",
        )
    return tokens, logits


def _own_block(
    seen: torch.Tensor, vocab_size: int, stage: str, rows: int, dp: tuple[int, int]
) -> torch.Tensor:
    """What the sampler was handed for this rank's rows: all of it, or, when
    handed every LM-head-DP rank's rows, the block of this rank's place, once
    every row's padding is checked masked."""
    size, place = dp
    if size > 1 and seen.dim() == 2 and seen.shape[0] == size * rows != rows:
        _check_padding(seen, vocab_size, stage)
        return seen[place * rows : (place + 1) * rows]
    return seen


def _check_padding(seen: torch.Tensor, vocab_size: int, stage: str) -> None:
    padding = seen[:, vocab_size:]
    unmasked = padding != float("-inf")
    if bool(unmasked.any()):
        ids = (unmasked.any(dim=0).nonzero().reshape(-1) + vocab_size).tolist()
        raise PortFailure(
            stage,
            f"the {stage} forward handed the sampler the padded vocabulary's id(s) {ids[:8]} unmasked "
            f"(logit {float(padding[unmasked][0]):.4g}): ids from vocab_size {vocab_size} on are no tokens "
            "and must be at -inf, never sampled",
        )


def _check_handed(seen: torch.Tensor, logits: torch.Tensor, vocab_size: int, stage: str, dp: int = 1) -> None:
    if seen.dim() != 2 or seen.shape[0] != logits.shape[0] or seen.shape[1] < vocab_size:
        raise PortFailure(
            stage,
            f"the {stage} forward handed the sampler logits of shape {list(seen.shape)}: "
            f"{logits.shape[0]} row(s) of at least the {vocab_size} ids of the vocabulary",
        )
    _check_padding(seen, vocab_size, stage)
    real = seen[:, :vocab_size]
    if not torch.equal(real, logits):
        differ = (real != logits).any(dim=0).nonzero().reshape(-1).tolist()
        hint = ""
        if dp > 1:
            hint = (
                f" (with LM-head DP {dp} the sampler reduces over the LM-head TP group, whose ranks hold "
                "different replicas' rows: each must hand it every LM-head-DP rank's rows and keep its own tokens)"
            )
        raise PortFailure(
            stage,
            f"the {stage} forward handed the sampler other logits than it returned for {len(differ)} "
            f"id(s) of the vocabulary, first {differ[:8]}: the sampler must see every id with its logit{hint}",
        )
