"""Stand-in for ``vllm_neuron.nn``: tensor-parallel linear layers and the
vocabulary-sharded embedding. ``tp_group`` is a process group (the
coordinator's ``device_group``); None means a single rank."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from . import collectives


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


class Sampler(nn.Module):
    """On-device sampling stand-in: greedy (argmax) over the full vocabulary.
    Returns ``(tokens int32 [N], logits [N, V])``. ``sampled_from`` keeps the
    logits of its last call, gathered over the ranks, before ``logit_mask``:
    what the model handed it, every column of its (padded) vocabulary, for
    the validator to check (``validate.sampled_output``); ``returned`` its
    output."""

    def __init__(self, on_device_sampling_config: Any = None, process_group: Any = None) -> None:
        super().__init__()
        self.config = on_device_sampling_config
        self.process_group = process_group
        self.sampled_from: torch.Tensor | None = None
        self.returned: tuple[torch.Tensor, torch.Tensor] | None = None  # its last output, as returned

    def forward(
        self,
        logits: torch.Tensor,
        sampling_params: Any = None,
        logit_mask: torch.Tensor | None = None,
        tp_rank: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        logits = collectives.all_gather(logits, -1, self.process_group)
        self.sampled_from = logits.detach().clone()
        if logit_mask is not None:
            logits = logits.masked_fill(~logit_mask.bool(), float("-inf"))
        self.returned = (torch.argmax(logits, dim=-1).to(torch.int32), logits)
        return self.returned
