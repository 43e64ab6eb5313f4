"""Stand-in for ``vllm.distributed.parallel_state`` (and the vllm_neuron
parallel-state getters): group coordinators over the validation run's ranks.

``configure(group, ep_degree)`` sets the process group every getter
describes: the single-process ``LOCAL_GROUP`` for TP = 1, or the default
torch.distributed group of a multi-process run. Data-parallel groups then
have size 1, the component TP groups are the TP group, and the DCP groups
are those of DCP size 1 (the DCP group a single rank, the DCP TP group the
TP group).

``configure_layout(layout, rank)`` lays out a run with data or context
parallelism (``autoport_cst.validate.layout``) over the default
torch.distributed group of ``layout.world`` ranks, creating every sub-group
collectively, twice: the decode graph's groups (``"decode"``: attention DP
column and TP supergroup, MLP / embedding / LM-head TP supergroups and DP
columns, vLLM's DP column, the DCP, DCP KV and DCP TP groups) and the
prefill graph's (``"prefill"``: each replica's TP group alone, with DCP only
for a context-parallel prefill). ``activate(name)`` selects the layout the
getters describe; the driver activates one while it builds, loads and runs
the graph of that layout.

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
            collectives.reached("barrier", torch.empty(0), self.world_size)
            torch.distributed.barrier(group=self.device_group)

    def __repr__(self) -> str:
        return (
            f"GroupCoordinator({self.unique_name}, world_size={self.world_size}, "
            f"rank_in_group={self.rank_in_group})"
        )


_TP: GroupCoordinator | None = None
_SINGLE: GroupCoordinator = GroupCoordinator(LOCAL_GROUP, name="single")
# The active layout's other groups (see _groups_of_plain_tp for their names).
_GROUPS: dict[str, GroupCoordinator] = {}


@dataclass
class _ExpertParallel:
    degree: int = 1
    rank: int = 0
    tp_group: GroupCoordinator | None = None  # the EP-TP row of this rank (None: the TP group)
    group: GroupCoordinator | None = None  # the EP column of this rank (None: size 1)
    read: bool = False  # whether model code asked for the EP degree or rank


_EP = _ExpertParallel()


@dataclass
class _Layout:
    tp: GroupCoordinator
    groups: dict[str, GroupCoordinator]
    ep: _ExpertParallel


_LAYOUTS: dict[str, _Layout] = {}


def _groups_of_plain_tp(tp: GroupCoordinator) -> dict[str, GroupCoordinator]:
    """The groups of a TP-only run: DP and DCP groups of one rank, component
    TP groups and the DCP TP group equal to the TP group."""
    groups = {"world": tp, "dp": _SINGLE, "dcp": _SINGLE, "dcp_tp": tp}
    for component in ("attention", "mlp", "embedding", "lm_head"):
        groups[f"{component}_tp"] = tp
        groups[f"{component}_dp"] = _SINGLE
    return groups


def configure(device_group: Any, ep_degree: int = 1) -> GroupCoordinator:
    """Make ``device_group`` the tensor-parallel group of this process and lay
    out ``ep_degree`` expert-parallel partitions inside it.

    With ``ep_degree > 1`` every rank of ``device_group`` must call this (the
    sub-groups are created collectively, in the same order on every rank)."""
    global _TP, _EP, _GROUPS
    _LAYOUTS.clear()
    _TP = GroupCoordinator(device_group, name="tp")
    _GROUPS = _groups_of_plain_tp(_TP)
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
        group=GroupCoordinator(
            column_groups[rank % per_partition], name="ep", ranks=columns[rank % per_partition]
        ),
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


class _GroupFactory:
    """Process groups over rank lists, created once per distinct list, in the
    order asked (every rank asks for the same lists in the same order)."""

    def __init__(self, world: int) -> None:
        import torch.distributed as dist

        self.world = world
        self.created: dict[tuple[int, ...], Any] = {tuple(range(world)): dist.group.WORLD}

    def group(self, ranks: list[int]) -> Any:
        key = tuple(ranks)
        if len(key) == 1:
            return LOCAL_GROUP
        if key not in self.created:
            import torch.distributed as dist

            self.created[key] = dist.new_group(list(key), backend="gloo")
        return self.created[key]

    def coordinators(self, partitions: dict[str, list[list[int]]], rank: int) -> dict[str, GroupCoordinator]:
        """Create every group of every partition; this rank's coordinators."""
        from autoport_cst.validate.layout import group_of

        mine = {}
        for name, partition in partitions.items():
            groups = [self.group(ranks) for ranks in partition]
            own = group_of(partition, rank)
            mine[name] = GroupCoordinator(groups[partition.index(own)], name=name, ranks=own)
        return mine


def configure_layout(layout: Any, rank: int) -> None:
    """Lay out ``layout`` (a ``ParallelLayout`` over the default
    torch.distributed group, this process being global rank ``rank``):
    the ``"decode"`` and ``"prefill"`` groups (module docstring). Every rank
    must call it. The decode layout is active afterwards."""
    from autoport_cst.validate.layout import partitions

    _LAYOUTS.clear()
    factory = _GroupFactory(layout.world)
    decode = factory.coordinators(partitions(layout.decode_layout()), rank)
    prefill_layout = layout.prefill_layout()
    prefill_parts = {
        name: [[d * layout.tp + r for r in group] for d in range(layout.dp) for group in partition]
        for name, partition in partitions(prefill_layout).items()
    }
    prefill = factory.coordinators(prefill_parts, rank)
    for name, groups, sizes in (
        ("decode", decode, layout.decode_layout()),
        ("prefill", prefill, prefill_layout),
    ):
        groups["dcp_kv"] = groups["dcp"]
        _LAYOUTS[name] = _Layout(groups["tp"], groups, _layout_ep(groups, sizes.ep))
    activate("decode")


def _layout_ep(groups: dict[str, GroupCoordinator], degree: int) -> _ExpertParallel:
    if degree == 1:
        return _ExpertParallel()
    return _ExpertParallel(
        degree=degree,
        rank=groups["tp"].rank_in_group // groups["ep_tp"].world_size,
        tp_group=groups["ep_tp"],
        group=groups["ep"],
    )


def activate(name: str) -> None:
    """Make the layout ``name`` of ``configure_layout`` the one the getters
    describe."""
    global _TP, _GROUPS, _EP
    layout = _LAYOUTS[name]
    _TP, _GROUPS, _EP = layout.tp, layout.groups, layout.ep


def layouts() -> list[str]:
    return list(_LAYOUTS)


def reset() -> None:
    global _TP, _EP, _GROUPS
    _TP = None
    _GROUPS = {}
    _EP = _ExpertParallel()
    _LAYOUTS.clear()


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


def group_layout() -> dict[str, list[int]]:
    """The ranks of this rank's groups in the active layout (for the report)."""
    return {name: list(group.ranks) for name, group in sorted(_GROUPS.items()) if group is not _SINGLE}


def get_tp_group() -> GroupCoordinator:
    if _TP is None:
        raise RuntimeError(
            "the CPU stand-in's tensor-parallel group is not configured: "
            "run the model through autoport_cst.validate"
        )
    return _TP


def _group(name: str) -> GroupCoordinator:
    get_tp_group()
    return _GROUPS[name]


def get_tensor_model_parallel_world_size() -> int:
    return get_tp_group().world_size


def get_tensor_model_parallel_rank() -> int:
    return get_tp_group().rank_in_group


def model_parallel_is_initialized() -> bool:
    return _TP is not None


def get_world_group() -> GroupCoordinator:
    return _group("world")


def get_dp_group() -> GroupCoordinator:
    """vLLM's data-parallel group: the same TP rank in every replica."""
    return _group("dp")


def get_dcp_group() -> GroupCoordinator:
    """vLLM's decode-context-parallel group: ``dcp`` consecutive TP ranks."""
    return _group("dcp")


def get_pp_group() -> GroupCoordinator:
    return _SINGLE


def get_wide_ep_group() -> GroupCoordinator:
    return _SINGLE


# vllm_neuron.parallel.neuron_parallel_state (see the module docstring and
# autoport_cst.validate.layout for the layouts).


def get_neuron_attention_tp_group() -> GroupCoordinator:
    return _group("attention_tp")


def get_neuron_mlp_tp_group() -> GroupCoordinator:
    return _group("mlp_tp")


def get_neuron_embedding_tp_group() -> GroupCoordinator:
    return _group("embedding_tp")


def get_neuron_lm_head_tp_group() -> GroupCoordinator:
    return _group("lm_head_tp")


def get_neuron_attention_dp_group() -> GroupCoordinator:
    return _group("attention_dp")


def get_neuron_mlp_dp_group() -> GroupCoordinator:
    return _group("mlp_dp")


def get_neuron_embedding_dp_group() -> GroupCoordinator:
    return _group("embedding_dp")


def get_neuron_lm_head_dp_group() -> GroupCoordinator:
    return _group("lm_head_dp")


def get_neuron_dcp_kv_group() -> GroupCoordinator:
    """The ranks with the same KV heads and different tokens (the DCP group)."""
    return _group("dcp")


def get_neuron_dcp_tp_group() -> GroupCoordinator:
    """The ranks with the same tokens and different heads (stride ``dcp``)."""
    return _group("dcp_tp")


def get_neuron_attention_dp_rank() -> int:
    return get_neuron_attention_dp_group().rank_in_group


def get_neuron_attention_dp_size() -> int:
    return get_neuron_attention_dp_group().world_size


def get_neuron_mlp_dp_rank() -> int:
    return get_neuron_mlp_dp_group().rank_in_group


def get_neuron_mlp_dp_size() -> int:
    return get_neuron_mlp_dp_group().world_size


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


def initialize_neuron_parallel_state(*args, **kwargs) -> None:
    """The validation driver configures the groups itself; nothing to do."""


def destroy_neuron_parallel_state() -> None:
    """Groups are owned by the validation driver; nothing to do."""
