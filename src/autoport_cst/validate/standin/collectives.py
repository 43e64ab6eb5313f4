"""Collectives over a process group, for the stand-in layers and groups.

A group is either a ``torch.distributed`` process group (TP > 1, gloo backend,
one process per rank) or ``LOCAL_GROUP``, the single-process group of TP = 1,
where every collective is the identity. All functions keep the semantics the
vllm_neuron layers rely on: ``all_gather`` concatenates the ranks' tensors
along ``dim`` in rank order, ``reduce_scatter`` sums over ranks and returns
this rank's chunk of ``dim``, ``all_reduce`` sums in place and returns the
same tensor.

``refusing_collectives()`` makes every collective over more than one rank
raise ``CollectiveReached`` before it communicates (on every rank alike, so
no rank waits for another): the validation's prefill-length check
(``validate.sp_length_check``) asks a port to refuse an input before any
collective, and tells a refusal from a run that reached one.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist


class LocalProcessGroup:
    """The process group of a single-process run (world size 1)."""

    def size(self) -> int:
        return 1

    def rank(self) -> int:
        return 0

    def __repr__(self) -> str:
        return "LocalProcessGroup(size=1)"


LOCAL_GROUP = LocalProcessGroup()


class CollectiveReached(Exception):
    """A collective was called inside ``refusing_collectives()``."""


_REFUSING: list[bool] = [False]


@contextlib.contextmanager
def refusing_collectives() -> Iterator[None]:
    """Collectives over more than one rank raise ``CollectiveReached`` in the block."""
    previous, _REFUSING[0] = _REFUSING[0], True
    try:
        yield
    finally:
        _REFUSING[0] = previous


def reached(name: str, tensor: torch.Tensor, world: int) -> None:
    """Called by each collective over ``world`` > 1 ranks before it communicates."""
    if _REFUSING[0]:
        raise CollectiveReached(f"{name} of shape {tuple(tensor.shape)} over {world} ranks")


def group_size(group: Any) -> int:
    if group is None or isinstance(group, LocalProcessGroup):
        return 1
    return dist.get_world_size(group)


def group_rank(group: Any) -> int:
    if group is None or isinstance(group, LocalProcessGroup):
        return 0
    return dist.get_rank(group)


def all_gather(tensor: torch.Tensor, dim: int, group: Any) -> torch.Tensor:
    """Concatenate every rank's ``tensor`` along ``dim``, in rank order."""
    world = group_size(group)
    if world == 1:
        return tensor
    reached("all_gather", tensor, world)
    parts = [torch.empty_like(tensor) for _ in range(world)]
    dist.all_gather(parts, tensor.contiguous(), group=group)
    return torch.cat(parts, dim=dim)


def reduce_scatter(tensor: torch.Tensor, dim: int, group: Any) -> torch.Tensor:
    """Sum ``tensor`` over ranks, then return this rank's chunk of ``dim``."""
    world = group_size(group)
    if world == 1:
        return tensor
    reached("reduce_scatter", tensor, world)
    dim = dim % tensor.dim()
    if tensor.shape[dim] % world != 0:
        raise ValueError(
            f"reduce_scatter: dimension {dim} of shape {tuple(tensor.shape)} "
            f"is not divisible by the group size {world}"
        )
    moved = tensor.movedim(dim, 0).contiguous()
    out = torch.empty((moved.shape[0] // world, *moved.shape[1:]), dtype=moved.dtype, device=moved.device)
    dist.reduce_scatter_tensor(out, moved, op=dist.ReduceOp.SUM, group=group)
    return out.movedim(0, dim)


def all_reduce(tensor: torch.Tensor, group: Any) -> torch.Tensor:
    """Sum ``tensor`` over ranks in place and return it."""
    if group_size(group) == 1:
        return tensor
    reached("all_reduce", tensor, group_size(group))
    if not tensor.is_contiguous():
        summed = tensor.contiguous()
        dist.all_reduce(summed, op=dist.ReduceOp.SUM, group=group)
        tensor.copy_(summed)
        return tensor
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group)
    return tensor


def all_to_all(tensor: torch.Tensor, split_dim: int, concat_dim: int, group: Any) -> torch.Tensor:
    """Split ``tensor`` into ``world`` chunks along ``split_dim``, send chunk
    ``i`` to rank ``i``, and concatenate the chunks received, in rank order,
    along ``concat_dim``."""
    world = group_size(group)
    if world == 1:
        return tensor
    reached("all_to_all", tensor, world)
    if tensor.shape[split_dim] % world != 0:
        raise ValueError(
            f"all_to_all: dimension {split_dim} of shape {tuple(tensor.shape)} "
            f"is not divisible by the group size {world}"
        )
    sent = [chunk.contiguous() for chunk in tensor.chunk(world, dim=split_dim)]
    received = [torch.empty_like(chunk) for chunk in sent]
    dist.all_to_all(received, sent, group=group)
    return torch.cat(received, dim=concat_dim)
