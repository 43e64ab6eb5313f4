"""The parallel layout of a validation run, and the process groups of every
rank in it, as vllm_neuron lays them out.

``ParallelLayout`` holds the sizes: TP; the decode-only data-parallel
degrees of the attention (``attention_dp``), the dense MLP (``mlp_dp``), the
embedding (``embedding_dp``) and the LM head (``lm_head_dp``); decode context
parallelism (``dcp``, with the KV-cache interleave size ``dcp_interleave``,
and ``prefill_dcp``: the prefill graph runs context-parallel too,
``apply_prefill_dcp``); and the EP degree.

Ranks: the world is ``tp * dp`` ranks (``dp`` the largest DP degree, the vLLM
data-parallel size). DP replica ``d`` holds the TP group ``[d tp .. d tp +
tp - 1]``; global rank ``g`` is TP rank ``g % tp`` of replica ``g // tp``. A
component with DP degree ``c`` (which must divide ``dp``) has

- a TP *supergroup* of ``tp * c`` ranks: the TP groups of ``c`` consecutive
  replicas, replica by replica (``[0 .. 2 tp - 1]`` for ``c = 2``): its
  weights are sharded over it and its decode partial sums reduced over it;
- a DP *column*: the ranks at the same TP position in those ``c`` replicas
  (``[t, tp + t]``), over which the decode batches are gathered.

The attention's DP column is the attention-DP group; its supergroup the
attention TP group. Decode context parallelism lives inside each TP group:
the DCP group (vLLM's ``get_dcp_group``, also the DCP KV group) holds ``dcp``
consecutive TP ranks; the DCP TP group the ranks at the same place in each
DCP group (stride ``dcp``). EP rows and columns are as ``parallel_state``
describes them (EP inside a single TP group).

Component DP and attention DP are decode-only: the prefill graph is plain TP
(``prefill_layout``), as in a disaggregated deployment, where a prefill
server hands the KV cache to the decode server. ``ParallelLayout`` is a
plain, picklable value.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import reduce
from math import gcd

from autoport_cst.errors import InputError
from autoport_cst.research.parallelism import config_dims

DP_COMPONENTS = ("attention", "mlp", "embedding", "lm_head")


@dataclass(frozen=True)
class ParallelLayout:
    tp: int = 1
    attention_dp: int = 1
    mlp_dp: int = 1
    embedding_dp: int = 1
    lm_head_dp: int = 1
    dcp: int = 1
    dcp_interleave: int = 1
    prefill_dcp: bool = False
    ep: int = 1

    def component_dp(self, component: str) -> int:
        return getattr(self, f"{component}_dp")

    @property
    def dp(self) -> int:
        """The vLLM data-parallel size: the smallest multiple of every
        component's DP degree."""
        degrees = [self.component_dp(c) for c in DP_COMPONENTS]
        return reduce(lambda a, b: a * b // gcd(a, b), degrees, 1)

    @property
    def world(self) -> int:
        return self.tp * self.dp

    @property
    def disaggregated(self) -> bool:
        """Whether decode runs in a graph of its own, fed the prefill graph's
        KV cache (any DP or DCP)."""
        return self.dp > 1 or self.dcp > 1

    def prefill_layout(self) -> ParallelLayout:
        """The prefill graph's layout: TP only, with DCP when ``prefill_dcp``."""
        dcp = self.dcp if self.prefill_dcp else 1
        return ParallelLayout(
            tp=self.tp,
            dcp=dcp,
            dcp_interleave=self.dcp_interleave if dcp > 1 else 1,
            prefill_dcp=self.prefill_dcp and dcp > 1,
            ep=self.ep,
        )

    def decode_layout(self) -> ParallelLayout:
        """The decode graph's layout (``apply_prefill_dcp`` off)."""
        return replace(self, prefill_dcp=False)

    def describe(self) -> dict:
        return {
            "tp": self.tp,
            "dp": self.dp,
            "attention_dp": self.attention_dp,
            "mlp_dp": self.mlp_dp,
            "embedding_dp": self.embedding_dp,
            "lm_head_dp": self.lm_head_dp,
            "dcp": self.dcp,
            "dcp_interleave": self.dcp_interleave,
            "prefill_dcp": self.prefill_dcp,
            "world": self.world,
        }


def replica_of(layout: ParallelLayout, rank: int) -> int:
    return rank // layout.tp


def tp_rank_of(layout: ParallelLayout, rank: int) -> int:
    return rank % layout.tp


# -- partitions of the world ----------------------------------------------------------


def _supergroups(layout: ParallelLayout, size: int) -> list[list[int]]:
    """TP supergroups of ``size`` consecutive replicas, replica by replica."""
    tp = layout.tp
    return [list(range(first * tp, (first + size) * tp)) for first in range(0, layout.dp, size)]


def _columns(layout: ParallelLayout, size: int) -> list[list[int]]:
    """DP columns: the same TP position in ``size`` consecutive replicas."""
    tp = layout.tp
    return [
        [(first + k) * tp + t for k in range(size)] for first in range(0, layout.dp, size) for t in range(tp)
    ]


def _within_tp(layout: ParallelLayout, groups_of_tp_ranks: list[list[int]]) -> list[list[int]]:
    """The given partition of TP ranks, in every replica."""
    return [[d * layout.tp + t for t in group] for d in range(layout.dp) for group in groups_of_tp_ranks]


def partitions(layout: ParallelLayout) -> dict[str, list[list[int]]]:
    """Every group kind and its partition of the world, in a fixed order (all
    ranks create the groups in this order)."""
    tp, dcp = layout.tp, layout.dcp
    result = {
        "tp": _within_tp(layout, [list(range(tp))]),
        "dp": _columns(layout, layout.dp),
        "world": [list(range(layout.world))],
        "dcp": _within_tp(layout, [list(range(c * dcp, (c + 1) * dcp)) for c in range(tp // dcp)]),
        "dcp_tp": _within_tp(layout, [list(range(p, tp, dcp)) for p in range(dcp)]),
    }
    for component in DP_COMPONENTS:
        size = layout.component_dp(component)
        result[f"{component}_tp"] = _supergroups(layout, size)
        result[f"{component}_dp"] = _columns(layout, size)
    if layout.ep > 1:
        per_partition = tp // layout.ep
        result["ep_tp"] = _within_tp(
            layout, [list(range(k * per_partition, (k + 1) * per_partition)) for k in range(layout.ep)]
        )
        result["ep"] = _within_tp(layout, [list(range(c, tp, per_partition)) for c in range(per_partition)])
    return result


def group_of(partition: list[list[int]], rank: int) -> list[int]:
    for group in partition:
        if rank in group:
            return group
    raise ValueError(f"rank {rank} is in no group of {partition}")


# -- checks -------------------------------------------------------------------------------


def check_layout(layout: ParallelLayout, config: dict, max_world: int) -> None:
    """Refuse layouts vllm_neuron does not serve, or that the checkpoint
    cannot take, naming the option (``InputError``)."""
    for name in ("attention_dp", "mlp_dp", "embedding_dp", "lm_head_dp", "dcp", "dcp_interleave"):
        value = getattr(layout, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise InputError(f"--{name.replace('_', '-')} must be a positive integer, got {value!r}")
    degrees = {c: layout.component_dp(c) for c in DP_COMPONENTS if layout.component_dp(c) > 1}
    if degrees and max(degrees.values()) != layout.dp:
        raise InputError(
            "every DP degree must divide the largest one (the vLLM data-parallel size), got "
            + ", ".join(f"--{c.replace('_', '-')}-dp {n}" for c, n in degrees.items())
        )
    if layout.world > max_world:
        raise InputError(f"the layout needs {layout.world} ranks (tp x dp); at most {max_world} run locally")
    if layout.ep > 1 and layout.dp > 1:
        raise InputError("--ep does not combine with DP options in validation (EP runs inside one TP group)")
    _check_dcp(layout, config)


def _check_dcp(layout: ParallelLayout, config: dict) -> None:
    if layout.dcp == 1:
        if layout.prefill_dcp or layout.dcp_interleave != 1:
            raise InputError("--prefill-dcp and --dcp-interleave need --dcp 2 or more")
        return
    tp, dcp = layout.tp, layout.dcp
    if tp % dcp != 0:
        raise InputError(f"--dcp {dcp} needs --tp to be a multiple of it (DCP runs inside TP), got --tp {tp}")
    if layout.attention_dp > 1:
        raise InputError("--dcp does not combine with --attention-dp (vllm_neuron serves one or the other)")
    if layout.prefill_dcp and tp != dcp:
        raise InputError(
            f"--prefill-dcp needs --tp equal to --dcp (the prefill graph's context-parallel ranks hand "
            f"their cache to the decode graph's same ranks), got --tp {tp} --dcp {dcp}"
        )
    dims = config_dims(config)  # the head counts under any of their config names (Bloom's n_head)
    if dims is not None:
        heads, kv_heads = dims.num_heads, dims.num_kv_heads
        if kv_heads * dcp > tp:
            raise InputError(
                f"--dcp {dcp}: the {kv_heads} KV heads must be replicated over each DCP group "
                f"(num_key_value_heads x dcp <= tp), got --tp {tp}"
            )
        if (heads // kv_heads) % dcp != 0:
            raise InputError(
                f"--dcp {dcp}: the {heads // kv_heads} query heads per KV head are not a multiple of it"
            )
