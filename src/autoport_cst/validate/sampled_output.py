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
- the tokens returned are the sampler's greedy choice over those logits;
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
leaves it unmasked.
"""

from __future__ import annotations

from typing import Any

import torch

from .port_failure import PortFailure

LOGPROBS = 1  # max_logprobs of the sampling run: the forward returns the logits beside the tokens


def sampling_neuron_config(**sizes: Any) -> Any:
    """The stand-in NeuronConfig of a run with on-device sampling (its
    default sampling config) and logprobs, with the given layout fields."""
    from .standin import neuron_config as nc

    return nc.NeuronConfig(max_logprobs=LOGPROBS, **sizes)


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
    output: Any, model: Any, vocab_size: int, stage: str, rows: int, dp: tuple[int, int] = (1, 0)
) -> torch.Tensor:
    """The logits of a forward with on-device sampling, after the checks of
    the module docstring; ``PortFailure`` naming the first that fails.
    ``dp``: the LM-head DP group's (size, this rank's place) (``lm_head_dp``)."""
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
    chosen = logits.argmax(dim=-1)
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
            f"the {stage} forward returned token {int(tokens[row])} at sampling row {row}, not the greedy "
            f"sampler's {int(chosen[row])}{_rank_hint(sampler)}",
        )
    return logits


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
