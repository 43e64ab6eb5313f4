"""Stand-in for ``vllm_neuron.nn``: tensor-parallel linear layers and the
vocabulary-sharded embedding. ``tp_group`` is a process group (the
coordinator's ``device_group``); None means a single rank."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from . import collectives, sampling


class ColumnParallelLinear(nn.Module):
    """``y = x @ W.T + b`` with the output dimension sharded over ranks:
    weight ``[out / tp, in]`` (checkpoint layout); ``gather_output``
    concatenates the ranks' outputs on the last dimension."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        gather_output: bool = False,
        device: Any = None,
        dtype: torch.dtype | None = None,
        tp_group: Any = None,
    ) -> None:
        super().__init__()
        self.tp_group = tp_group
        self.tp_size = collectives.group_size(tp_group)
        self.tp_rank = collectives.group_rank(tp_group)
        if out_features % self.tp_size != 0:
            raise ValueError(
                f"ColumnParallelLinear: out_features {out_features} is not divisible "
                f"by the TP size {self.tp_size}"
            )
        self.in_features = in_features
        self.out_features = out_features
        self.out_features_per_rank = out_features // self.tp_size
        self.gather_output = gather_output
        self.weight = nn.Parameter(
            torch.empty(self.out_features_per_rank, in_features, device=device, dtype=dtype)
        )
        self.bias = (
            nn.Parameter(torch.zeros(self.out_features_per_rank, device=device, dtype=dtype))
            if bias
            else None
        )
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        output = F.linear(x.to(self.weight.dtype), self.weight, self.bias)
        if self.gather_output:
            output = collectives.all_gather(output, -1, self.tp_group)
        return output


class RowParallelLinear(nn.Module):
    """``y = sum_ranks(x_r @ W_r.T) + b`` with the input dimension sharded:
    weight ``[out, in / tp]``; the bias is added once, after the sum."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        input_is_parallel: bool = True,
        device: Any = None,
        dtype: torch.dtype | None = None,
        tp_group: Any = None,
    ) -> None:
        super().__init__()
        self.tp_group = tp_group
        self.tp_size = collectives.group_size(tp_group)
        self.tp_rank = collectives.group_rank(tp_group)
        if in_features % self.tp_size != 0:
            raise ValueError(
                f"RowParallelLinear: in_features {in_features} is not divisible by the TP size {self.tp_size}"
            )
        self.in_features = in_features
        self.out_features = out_features
        self.in_features_per_rank = in_features // self.tp_size
        self.input_is_parallel = input_is_parallel
        self.weight = nn.Parameter(
            torch.empty(out_features, self.in_features_per_rank, device=device, dtype=dtype)
        )
        self.bias = nn.Parameter(torch.zeros(out_features, device=device, dtype=dtype)) if bias else None
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.input_is_parallel and self.tp_size > 1:
            x = x.chunk(self.tp_size, dim=-1)[self.tp_rank]
        output = F.linear(x.to(self.weight.dtype), self.weight)
        output = collectives.all_reduce(output, self.tp_group)
        if self.bias is not None:
            output = output + self.bias
        return output


class VocabDimShardedEmbedding(nn.Module):
    """Embedding with the vocabulary sharded over ranks: weight
    ``[ceil(V / tp), H]``. Ids outside this rank's range contribute zeros;
    the partial lookups are summed over ranks, either reduce-scattered on the
    token dimension (``scatter_tokens``, the sequence-parallel prefill layout)
    or all-reduced."""

    def __init__(
        self,
        vocab_size: int,
        embed_dim: int,
        device: Any = None,
        dtype: torch.dtype | None = None,
        tp_group: Any = None,
    ) -> None:
        super().__init__()
        self.tp_group = tp_group
        self.tp_size = collectives.group_size(tp_group)
        self.tp_rank = collectives.group_rank(tp_group)
        self.vocab_size = vocab_size
        self.embed_dim = embed_dim
        self.vocab_size_per_rank = -(-vocab_size // self.tp_size)
        self.weight = nn.Parameter(
            torch.empty(self.vocab_size_per_rank, embed_dim, device=device, dtype=dtype)
        )
        nn.init.normal_(self.weight)

    def forward(
        self, input: torch.Tensor, scatter_tokens: bool = True, rank: int | None = None
    ) -> torch.Tensor:
        if input.dim() != 1:
            raise ValueError(
                f"VocabDimShardedEmbedding takes flat token ids [T], got shape {tuple(input.shape)}"
            )
        if self.tp_size == 1:
            return F.embedding(input, self.weight)
        rank = self.tp_rank if rank is None else int(rank)
        start = rank * self.vocab_size_per_rank
        local = input - start
        outside = (local < 0) | (local >= self.vocab_size_per_rank)
        local = local.masked_fill(outside, 0)
        output = F.embedding(local, self.weight)
        output = output.masked_fill(outside.unsqueeze(-1), 0)
        if scatter_tokens:
            return collectives.reduce_scatter(output, 0, self.tp_group)
        return collectives.all_reduce(output, self.tp_group)


def greedy_sampling_params(rows: int) -> torch.Tensor:
    """The runner's ``sampling_params`` of ``rows`` greedy requests: ``[rows,
    3]`` stacked (top_k, top_p, temperature), top-k off (-1), top-p 1,
    temperature 0."""
    return sampling.greedy_params(rows)


class Sampler(nn.Module):
    """On-device sampling stand-in, ``vllm_neuron.nn.sampler.Sampler``'s
    interface: ``Sampler(sampling_config, process_group=None,
    vocab_size=None)`` (the config is required: the real one reads its
    ``all_greedy``, ``max_top_k``, ``deterministic``, ``capture_topk``),
    called with this rank's shard of the logits ``[N, V / tp]`` over
    ``process_group``, the runner's ``sampling_params`` ``[N, 3]`` (top_k,
    top_p, temperature), a ``logit_mask`` and ``tp_rank``; returns what
    vllm_neuron's ``sample`` returns: the sampled token ids, int32 ``[N]``,
    nothing else (a forward that returns logits for logprobs gathers its own).

    ``tp_rank`` is used as the real one uses it, never checked against the
    group: it is the shard's place in ``process_group`` for the padding mask
    (given ``vocab_size``, ids from ``tp_rank * V / tp`` on), for the slice of
    a ``logit_mask`` wider than the shard, and for the distributed top-k's
    index offset (every call without ``all_greedy``): a rank handing the rank
    of another group (the TP rank to a sampler over the LM-head TP group)
    masks, and returns, other ids. Without ``tp_rank`` those calls are
    refused, as the real one refuses them. ``logit_mask`` (bool, False =
    disallowed) is one shard wide or divisible into shards.

    With ``all_greedy`` it takes the argmax; otherwise each row is sampled as
    ``vllm_neuron.functional.sample`` samples it (``sampling``: top-k, top-p,
    temperature, greedy below temperature 1e-5, a draw at 0.5 when the config
    is ``deterministic``); a random draw among several tokens is refused, and
    so is a call without ``sampling_params`` unless ``deterministic`` (the
    real one then samples every row at temperature 1.0). ``sampled_from``
    keeps the logits of its last call, gathered over the ranks, after its own
    padding mask and before ``logit_mask``: what the model handed it, every
    column of its (padded) vocabulary, for the validator to check
    (``validate.sampled_output``); ``returned`` its output; ``rank_used`` the
    rank each place of the group was given, when a call used ``tp_rank``;
    ``cap`` the number of candidates of its last top-k
    (``min(max_top_k, shard width)``, as the real one's)."""

    def __init__(
        self, sampling_config: Any, process_group: Any = None, vocab_size: int | None = None
    ) -> None:
        super().__init__()
        if sampling_config is None:
            raise TypeError(
                "Sampler: vllm_neuron's Sampler reads its sampling_config (all_greedy, max_top_k, "
                "deterministic, capture_topk): the NeuronConfig's on_device_sampling_config, not None"
            )
        self.config = sampling_config
        self.all_greedy = bool(sampling_config.all_greedy)
        self.max_top_k = sampling_config.max_top_k
        self.deterministic = bool(sampling_config.deterministic)
        self.capture_topk = sampling_config.capture_topk
        self.process_group = process_group
        self.vocab_size = vocab_size
        self.sampled_from: torch.Tensor | None = None
        self.returned: torch.Tensor | None = None  # its last output, as returned
        self.rank_used: list[int] | None = None
        self.cap: int | None = None

    def forward(
        self,
        logits: torch.Tensor,
        sampling_params: torch.Tensor | None = None,
        logit_mask: torch.Tensor | None = None,
        tp_rank: torch.Tensor | None = None,
    ) -> torch.Tensor:
        self.rank_used = None
        shards = collectives.group_size(self.process_group) if self.process_group is not None else 1
        width = logits.shape[-1]
        if self.vocab_size is not None and self.vocab_size < width * shards:
            rank = self._rank(tp_rank, "masking padded vocabulary shards", default=0)
            ids = torch.arange(width, device=logits.device) + rank * width
            logits = logits.masked_fill(ids >= self.vocab_size, float("-inf"))
        self.sampled_from = collectives.all_gather(logits, -1, self.process_group).detach().clone()
        if logit_mask is not None:
            logits = logits.masked_fill(~self._own_mask(logit_mask, width, tp_rank), float("-inf"))
        if self.all_greedy:  # the distributed argmax
            tokens = torch.argmax(collectives.all_gather(logits, -1, self.process_group), dim=-1)
        else:
            tokens = self._top_k_sample(logits, self._params(sampling_params, logits.shape[0]), tp_rank)
        self.returned = tokens.to(torch.int32)
        return self.returned

    def _top_k_sample(self, logits: torch.Tensor, params: torch.Tensor, tp_rank: Any) -> torch.Tensor:
        """The distributed top-k (each shard's ``cap`` largest, its ids offset
        by the rank given, gathered, the ``cap`` largest kept), then each
        row's choice (``sampling.choose``)."""
        width = logits.shape[-1]
        shards = collectives.group_size(self.process_group) if self.process_group is not None else 1
        offset = 0
        if shards > 1:
            offset = self._rank(tp_rank, "the distributed top-k (sampling without all_greedy)", tensor=False)
        self.cap = min(int(self.max_top_k), width)
        ids = torch.arange(width, device=logits.device).expand(logits.shape[0], -1) + offset * width
        values, ids = sampling.ordered(logits.float(), ids, self.cap)
        values = collectives.all_gather(values, -1, self.process_group)
        ids = collectives.all_gather(ids, -1, self.process_group)
        values, ids = sampling.ordered(values, ids, self.cap)
        return sampling.choose(values, ids, params, self.deterministic)

    def _rank(self, tp_rank: Any, use: str, default: int | None = None, tensor: bool = True) -> int:
        """The rank a call uses (``tp_rank``), as the real sampler takes it."""
        if tp_rank is None:
            if self.process_group is None and default is not None:
                return default
            raise ValueError(
                f"Sampler: tp_rank must be provided for {use} (vllm_neuron's Sampler refuses it)"
            )
        if tensor and not isinstance(tp_rank, torch.Tensor):
            raise TypeError(
                f"Sampler: tp_rank must be a tensor for {use}, got {type(tp_rank).__name__} "
                "(vllm_neuron's Sampler takes the rank as a tensor)"
            )
        if isinstance(tp_rank, torch.Tensor) and tp_rank.numel() != 1:
            raise ValueError(f"Sampler: tp_rank must hold one element, got shape {list(tp_rank.shape)}")
        rank = int(tp_rank)
        given = collectives.all_gather(torch.tensor([rank]), 0, self.process_group)
        self.rank_used = [int(r) for r in given]  # every shard's, by its place in the group
        return rank

    def _own_mask(self, logit_mask: torch.Tensor, width: int, tp_rank: Any) -> torch.Tensor:
        """This shard's columns of ``logit_mask``: as it is when one shard
        wide (or without a group), else the slice at ``tp_rank``."""
        if logit_mask.dtype != torch.bool:
            raise TypeError(f"Sampler: logit_mask must be bool (True = allowed), got {logit_mask.dtype}")
        full = logit_mask.shape[-1]
        if self.process_group is None or full == width:
            if full != width:
                raise ValueError(f"Sampler: logit_mask of {full} columns for logits of {width}")
            return logit_mask
        rank = self._rank(tp_rank, "a logit_mask wider than the shard")
        if full % width != 0:
            raise ValueError(
                f"Sampler: a full logit_mask's width must be divisible by the shard's: {full} by {width}"
            )
        if not 0 <= rank < full // width:
            raise IndexError(f"Sampler: tp_rank {rank} selects no shard of a logit_mask of {full} columns")
        return logit_mask[..., rank * width : (rank + 1) * width]

    def _params(self, sampling_params: torch.Tensor | None, rows: int) -> torch.Tensor:
        """The rows' ``sampling_params``: as given (``[rows, 3]``), or, when
        not given, vllm_neuron's defaults (top-k off, top-p 1, temperature
        1.0), which only a ``deterministic`` sampler draws from."""
        if sampling_params is None:
            if not self.deterministic:
                raise ValueError(
                    "Sampler called without sampling_params and all_greedy off: vllm_neuron's sample() "
                    "then draws at temperature 1.0, not greedily; the runner's sampling_params [N, 3] "
                    "(top_k, top_p, temperature) must reach the sampler"
                )
            return torch.tensor([[-1.0, 1.0, 1.0]]).repeat(rows, 1)
        if tuple(sampling_params.shape) != (rows, 3):
            raise ValueError(
                f"Sampler: sampling_params of shape {list(sampling_params.shape)} for {rows} row(s) "
                "of logits: [rows, 3] (top_k, top_p, temperature) expected"
            )
        return sampling_params

    def choice(
        self, logits: torch.Tensor, sampling_params: torch.Tensor | None, logit_mask: torch.Tensor | None
    ) -> torch.Tensor:
        """What this sampler returns, as its last call did (its candidate
        cap), for ``logits`` over the whole vocabulary ``[rows, V]``, their
        ``sampling_params`` (None: greedy) and ``logit_mask`` (its first
        ``V`` columns): the validator's expectation of its output."""
        if self.all_greedy or self.cap is None:
            sampling_params = None
        cap = logits.shape[-1] if self.cap is None else self.cap
        return sampling.full_vocabulary_choice(logits, sampling_params, logit_mask, cap, self.deterministic)
