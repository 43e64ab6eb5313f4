"""TP sizing of a vision tower apart from its text decoder: heads and MLP
intermediate size divide by TP (no KV-cache or even-heads rule), and a
decoder TP that cannot shard the tower is named."""

from __future__ import annotations

from autoport_cst.research.vision_parallelism import plan_tower_parallelism, tower_notes
from autoport_cst.spec import VisionSpec

# Qwen3-VL-8B's tower: 16 heads, intermediate 4304 = 16 x 269, about 0.58 B parameters
TOWER = VisionSpec(num_heads=16, intermediate_size=4304)


def test_tower_tp_follows_its_heads_and_intermediate_size():
    plan = plan_tower_parallelism(TOWER, 576_000_000)
    assert plan.valid_tps == (1, 2, 4, 8, 16)
    assert plan.recommended_tp == 1
    check = next(c for c in plan.checks if c.tp == 32)
    assert check.failures == (
        "16 tower attention heads not divisible by 32",
        "tower intermediate size 4304 not divisible by 32",
    )


def test_odd_heads_per_rank_are_valid_for_the_tower():
    plan = plan_tower_parallelism(VisionSpec(num_heads=6, intermediate_size=24), 1000)
    assert plan.valid_tps == (1, 2)  # 3 heads per rank at TP 2: no decode kernel in the tower


def test_a_decoder_tp_the_tower_cannot_take_is_named():
    plan = plan_tower_parallelism(TOWER, 576_000_000)
    assert len(tower_notes(plan, 16)) == 1
    notes = tower_notes(plan, 32)
    assert "the decoder's TP 32 cannot shard the vision tower" in notes[1]


def test_a_tower_too_large_for_one_rank_needs_tp():
    plan = plan_tower_parallelism(TOWER, 12 * 10**9, budget=20 * 10**9)
    assert plan.recommended_tp == 2
