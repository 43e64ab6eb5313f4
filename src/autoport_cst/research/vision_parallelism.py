"""Tensor-parallel sizes for a vision tower, apart from its text decoder
(the plugin's vision encoder parallelism: the tower may run at its own TP,
its replicas data-parallel over the decoder's ranks).

The tower's rules differ from the decoder's: it has no KV cache and no
decode step, so only its attention heads (sharded by head) and its MLP
intermediate size (column / row parallel) must divide by TP; the heads per
rank need not be even. Memory: its bf16 weights over TP ranks under the same
per-rank budget. The recommended TP is the smallest valid one that fits (the
tower is small: more ranks only add collectives); the decoder's TP must also
be valid for a port that runs the tower on the decoder's TP group (as the
qwen3_vl reference does).
"""

from __future__ import annotations

from dataclasses import dataclass

from autoport_cst.research.parallelism import BYTES_PER_PARAM, RANK_BUDGET_BYTES, WORLD_SIZE, tp_candidates
from autoport_cst.spec import VisionSpec


@dataclass(frozen=True)
class TowerTPCheck:
    tp: int
    valid: bool
    failures: tuple[str, ...]
    bytes_per_rank: int
    fits: bool


@dataclass(frozen=True)
class TowerParallelPlan:
    parameters: int
    checks: tuple[TowerTPCheck, ...]
    recommended_tp: int | None
    reason: str

    @property
    def valid_tps(self) -> tuple[int, ...]:
        return tuple(c.tp for c in self.checks if c.valid)


def check_tower_tp(tp: int, vision: VisionSpec, weight_bytes: int, budget: int) -> TowerTPCheck:
    failures = []
    heads, intermediate = vision.num_heads, vision.intermediate_size
    if not heads:
        failures.append("tower attention heads unknown")
    elif heads % tp:
        failures.append(f"{heads} tower attention heads not divisible by {tp}")
    if intermediate and intermediate % tp:
        failures.append(f"tower intermediate size {intermediate} not divisible by {tp}")
    per_rank = -(-weight_bytes // tp)
    return TowerTPCheck(tp, not failures, tuple(failures), per_rank, per_rank <= budget)


def plan_tower_parallelism(
    vision: VisionSpec, parameters: int, world_size: int = WORLD_SIZE, budget: int = RANK_BUDGET_BYTES
) -> TowerParallelPlan:
    weight_bytes = parameters * BYTES_PER_PARAM
    checks = tuple(check_tower_tp(tp, vision, weight_bytes, budget) for tp in tp_candidates(world_size))
    fitting = [c for c in checks if c.valid and c.fits]
    if not fitting:
        return TowerParallelPlan(
            parameters, checks, None, "no TP degree satisfies the tower's rules and fits"
        )
    best = fitting[0]
    reason = (
        f"tower TP {best.tp}: the smallest valid TP whose bf16 weights fit "
        f"({best.bytes_per_rank / 1e9:.2f} GB per rank); valid: {', '.join(str(c.tp) for c in checks if c.valid)}"
    )
    return TowerParallelPlan(parameters, checks, best.tp, reason)


def tower_notes(plan: TowerParallelPlan, decoder_tp: int | None) -> list[str]:
    """Pitfall lines: the tower's TP sizing, and whether the decoder's TP
    group can shard the tower too."""
    notes = [f"vision tower ({plan.parameters:,} parameters): {plan.reason}"]
    if decoder_tp is not None and decoder_tp not in plan.valid_tps:
        check = next(c for c in plan.checks if c.tp == decoder_tp)
        notes.append(
            f"the decoder's TP {decoder_tp} cannot shard the vision tower ({'; '.join(check.failures)}): "
            "a port running the tower on the decoder's TP group (qwen3_vl) needs another TP, or the tower "
            "its own TP group"
        )
    return notes
