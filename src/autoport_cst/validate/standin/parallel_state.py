"""Stand-in for ``vllm.distributed.parallel_state`` (and the vllm_neuron
parallel-state getters): group coordinators over the validation run's ranks.

``configure(group)`` sets the process group every getter describes: the
single-process ``LOCAL_GROUP`` for TP = 1, or the default torch.distributed
group of a multi-process run. Data-parallel, context-parallel and expert
groups have size 1 in the validation run.
"""

from __future__ import annotations

from typing import Any

import torch

from . import collectives
from .collectives import LOCAL_GROUP


class GroupCoordinator:
    """What model code reads from ``get_tp_group()``: ``world_size``,
    ``rank_in_group``, ``device_group`` and the collectives."""

    def __init__(self, device_group: Any, name: str = "tp") -> None:
        self.device_group = device_group
        self.cpu_group = device_group
        self.unique_name = name
        self.world_size = collectives.group_size(device_group)
        self.rank_in_group = collectives.group_rank(device_group)
        self.rank = self.rank_in_group
        self.local_rank = self.rank_in_group
        self.ranks = list(range(self.world_size))
        self.first_rank = 0
        self.last_rank = self.world_size - 1
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


def configure(device_group: Any) -> GroupCoordinator:
    """Make ``device_group`` the tensor-parallel group of this process."""
    global _TP
    _TP = GroupCoordinator(device_group, name="tp")
    return _TP


def reset() -> None:
    global _TP
    _TP = None


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
# groups coincide with the TP group; DP, DCP and EP groups have size 1.
get_neuron_attention_tp_group = get_tp_group
get_neuron_mlp_tp_group = get_tp_group
get_neuron_embedding_tp_group = get_tp_group
get_neuron_lm_head_tp_group = get_tp_group
get_neuron_ep_tp_group = get_tp_group
get_neuron_attention_dp_group = get_dp_group
get_neuron_mlp_dp_group = get_dp_group
get_neuron_embedding_dp_group = get_dp_group
get_neuron_lm_head_dp_group = get_dp_group
get_neuron_dcp_kv_group = get_dcp_group
get_neuron_dcp_tp_group = get_dcp_group
get_neuron_ep_group = get_dp_group


def get_neuron_attention_dp_rank() -> int:
    return 0


def get_neuron_ep_degree() -> int:
    return 1


def get_neuron_ep_rank() -> int:
    return 0


def is_initialized() -> bool:
    return model_parallel_is_initialized()


def initialize_neuron_parallel_state(tp_global_ranks=None, local_rank=0) -> None:
    """The validation driver configures the groups itself; nothing to do."""


def destroy_neuron_parallel_state() -> None:
    """Groups are owned by the validation driver; nothing to do."""
