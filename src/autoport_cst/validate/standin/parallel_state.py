"""Stand-in for ``vllm.distributed.parallel_state`` (and the vllm_neuron
parallel-state getters): group coordinators over the validation run's ranks.

``configure(group, ep_degree)`` sets the process group every getter
describes: the single-process ``LOCAL_GROUP`` for TP = 1, or the default
torch.distributed group of a multi-process run. Data-parallel and
context-parallel groups have size 1 in the validation run.

Expert parallelism runs inside the TP world, as vllm_neuron lays it out: with
``ep_degree`` E over a world of W ranks, ``t = W / E`` ranks share each expert
partition. The EP-TP groups are the rows ``[0 .. t-1], [t .. 2t-1], ...``
(rank ``r`` is in row ``r // t``, its EP rank), the EP groups the columns
``{r % t + k t}``. Without EP (``ep_degree`` 1) the EP degree is 1, the EP
rank 0 and the EP-TP group is the TP group.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from . import collectives
from .collectives import LOCAL_GROUP


class GroupCoordinator:
    """What model code reads from ``get_tp_group()``: ``world_size``,
    ``rank_in_group``, ``device_group`` and the collectives."""

    def __init__(self, device_group: Any, name: str = "tp", ranks: list[int] | None = None) -> None:
        self.device_group = device_group
        self.cpu_group = device_group
        self.unique_name = name
        self.world_size = collectives.group_size(device_group)
        self.rank_in_group = collectives.group_rank(device_group)
        self.ranks = list(ranks) if ranks is not None else list(range(self.world_size))
        self.rank = self.ranks[self.rank_in_group]
        self.local_rank = self.rank_in_group
        self.first_rank = self.ranks[0]
        self.last_rank = self.ranks[-1]
        self.is_first_rank = self.rank_in_group == 0
        self.is_last_rank = self.rank_in_group == self.world_size - 1

    def all_gather(self, input_: torch.Tensor, dim: int = -1) -> torch.Tensor:
        return collectives.all_gather(input_, dim, self.device_group)

    def reduce_scatter(self, input_: torch.Tensor, dim: int = -1) -> torch.Tensor:
        return collectives.reduce_scatter(input_, dim, self.device_group)

    def all_reduce(self, input_: torch.Tensor) -> torch.Tensor:
        return collectives.all_reduce(input_, self.device_group)

    def barrier(self) -> None:
        if self.world_size > 1:
            torch.distributed.barrier(group=self.device_group)

    def __repr__(self) -> str:
        return (
            f"GroupCoordinator({self.unique_name}, world_size={self.world_size}, "
            f"rank_in_group={self.rank_in_group})"
        )


_TP: GroupCoordinator | None = None
_SINGLE: GroupCoordinator = GroupCoordinator(LOCAL_GROUP, name="single")


@dataclass
class _ExpertParallel:
    degree: int = 1
    rank: int = 0
    tp_group: GroupCoordinator | None = None  # the EP-TP row of this rank (None: the TP group)
    group: GroupCoordinator | None = None  # the EP column of this rank (None: size 1)
    read: bool = False  # whether model code asked for the EP degree or rank


_EP = _ExpertParallel()


def configure(device_group: Any, ep_degree: int = 1) -> GroupCoordinator:
    """Make ``device_group`` the tensor-parallel group of this process and lay
    out ``ep_degree`` expert-parallel partitions inside it.

    With ``ep_degree > 1`` every rank of ``device_group`` must call this (the
    sub-groups are created collectively, in the same order on every rank)."""
    global _TP, _EP
    _TP = GroupCoordinator(device_group, name="tp")
    _EP = _ExpertParallel()
    world = _TP.world_size
    if ep_degree < 1 or world % ep_degree != 0:
        raise ValueError(f"the EP degree {ep_degree} does not divide the TP world of {world} ranks")
    if ep_degree == 1:
        return _TP
    per_partition = world // ep_degree
    rank = _TP.rank_in_group
    rows = [list(range(k * per_partition, (k + 1) * per_partition)) for k in range(ep_degree)]
    columns = [list(range(c, world, per_partition)) for c in range(per_partition)]
    row_groups = [_subgroup(ranks, device_group, world) for ranks in rows]
    column_groups = [_subgroup(ranks, device_group, world) for ranks in columns]
    ep_rank = rank // per_partition
    _EP = _ExpertParallel(
        degree=ep_degree,
        rank=ep_rank,
        tp_group=GroupCoordinator(row_groups[ep_rank], name="ep_tp", ranks=rows[ep_rank]),
        group=GroupCoordinator(column_groups[rank % per_partition], name="ep",
                               ranks=columns[rank % per_partition]),
    )
    return _TP


def _subgroup(ranks: list[int], device_group: Any, world: int) -> Any:
    """A process group over ``ranks`` (global ranks of ``device_group``)."""
    if len(ranks) == 1:
        return LOCAL_GROUP
    if len(ranks) == world:
        return device_group
    import torch.distributed as dist

    return dist.new_group(ranks, backend="gloo")


def reset() -> None:
    global _TP, _EP
    _TP = None
    _EP = _ExpertParallel()


def expert_parallel_read() -> bool:
    """Whether the model asked for the EP degree or rank since ``configure``."""
    return _EP.read


def expert_parallel_layout() -> dict[str, Any] | None:
    """This rank's place in the expert-parallel layout (None without EP)."""
    if _EP.degree == 1:
        return None
    return {
        "ep_degree": _EP.degree,
        "ep_rank": _EP.rank,
        "partition_ranks": list(_EP.tp_group.ranks) if _EP.tp_group is not None else [],
        "read_by_model": _EP.read,
    }


def get_tp_group() -> GroupCoordinator:
    if _TP is None:
        raise RuntimeError(
            "the CPU stand-in's tensor-parallel group is not configured: "
            "run the model through autoport_cst.validate"
        )
    return _TP


def get_tensor_model_parallel_world_size() -> int:
    return get_tp_group().world_size


def get_tensor_model_parallel_rank() -> int:
    return get_tp_group().rank_in_group


def model_parallel_is_initialized() -> bool:
    return _TP is not None


def get_dp_group() -> GroupCoordinator:
    return _SINGLE


def get_dcp_group() -> GroupCoordinator:
    return _SINGLE


def get_pp_group() -> GroupCoordinator:
    return _SINGLE


def get_wide_ep_group() -> GroupCoordinator:
    return _SINGLE


get_world_group = get_tp_group


# vllm_neuron.parallel.neuron_parallel_state: attention/MLP/embedding/LM-head
# groups coincide with the TP group; DP and DCP groups have size 1; the EP
# getters are below.
get_neuron_attention_tp_group = get_tp_group
get_neuron_mlp_tp_group = get_tp_group
get_neuron_embedding_tp_group = get_tp_group
get_neuron_lm_head_tp_group = get_tp_group
get_neuron_attention_dp_group = get_dp_group
get_neuron_mlp_dp_group = get_dp_group
get_neuron_embedding_dp_group = get_dp_group
get_neuron_lm_head_dp_group = get_dp_group
get_neuron_dcp_kv_group = get_dcp_group
get_neuron_dcp_tp_group = get_dcp_group


def get_neuron_attention_dp_rank() -> int:
    return 0


def get_neuron_ep_degree() -> int:
    _EP.read = True
    return _EP.degree


def get_neuron_ep_rank() -> int:
    _EP.read = True
    return _EP.rank


def get_neuron_ep_tp_group() -> GroupCoordinator:
    """The ranks sharing this rank's expert partition (the TP group without EP)."""
    return _EP.tp_group if _EP.tp_group is not None else get_tp_group()


def get_neuron_ep_group() -> GroupCoordinator:
    """The ranks holding the same intermediate slice of different partitions."""
    return _EP.group if _EP.group is not None else _SINGLE


def is_initialized() -> bool:
    return model_parallel_is_initialized()


def initialize_neuron_parallel_state(tp_global_ranks=None, local_rank=0) -> None:
    """The validation driver configures the groups itself; nothing to do."""


def destroy_neuron_parallel_state() -> None:
    """Groups are owned by the validation driver; nothing to do."""
