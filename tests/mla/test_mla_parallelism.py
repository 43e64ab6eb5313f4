"""Tensor-parallel rules for multi-latent attention: the head rules apply to
the query heads, the KV-head rule does not (one latent row per token and
layer, shared by the heads and the same on every rank), the latent cache's
size per token is stated and does not shrink with TP, and the replicated
low-rank projections count whole on every rank. DeepSeek-V3's published
dimensions (no weights)."""

from __future__ import annotations

from autoport_cst.research.parallelism import (
    ParallelDims,
    check_tp,
    config_dims,
    latent_cache_bytes_per_token,
    plan_parallelism,
)

DEEPSEEK_V3 = {
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "num_hidden_layers": 61,
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "n_routed_experts": 256,
    "kv_lora_rank": 512,
    "qk_rope_head_dim": 64,
    "q_lora_rank": 1536,
    "vocab_size": 129280,
}


def test_the_latent_cache_is_one_row_per_token_and_layer_on_every_rank():
    dims = config_dims(DEEPSEEK_V3)
    assert dims is not None and dims.latent_width == 576 and dims.num_layers == 61
    assert latent_cache_bytes_per_token(dims) == 576 * 61 * 2
    notes = [check_tp(tp, dims, 0).notes for tp in (8, 64)]
    assert notes[0] == notes[1]  # the same at every TP
    assert any("latent cache replicated" in n and "68.6 KiB per token" in n for n in notes[0])


def test_the_kv_head_rule_does_not_apply_to_latent_attention():
    dims = ParallelDims(
        num_heads=16, num_kv_heads=6, intermediate_size=1024, vocab_size=1024, latent_width=576, num_layers=2
    )
    check = check_tp(8, dims, 0)
    assert check.valid, check.failures
    assert not any("KV heads" in n for n in check.notes)
    softmax = check_tp(
        8, ParallelDims(num_heads=16, num_kv_heads=6, intermediate_size=1024, vocab_size=1024), 0
    )
    assert any(f.startswith("rule 3") for f in softmax.failures)


def test_the_head_rules_apply_to_the_query_heads():
    dims = ParallelDims(
        num_heads=16, num_kv_heads=16, intermediate_size=1024, vocab_size=1024, latent_width=576, num_layers=2
    )
    assert any(f.startswith("rule 1") for f in check_tp(32, dims, 0).failures)
    assert any(f.startswith("rule 2") for f in check_tp(16, dims, 0).failures)


def test_replicated_projections_count_whole_on_every_rank():
    dims = ParallelDims(
        num_heads=16,
        num_kv_heads=16,
        intermediate_size=1024,
        vocab_size=1024,
        latent_width=576,
        num_layers=2,
        replicated_parameters=1000,
    )
    assert check_tp(8, dims, 8000 * 2).bytes_per_rank == (8000 - 1000) * 2 // 8 + 1000 * 2


def test_deepseek_v3_in_bf16_needs_more_than_one_trn2_48xlarge():
    """671B parameters in bf16: every valid TP leaves more than 20 GB per rank,
    and expert parallelism (256 experts) does not shrink the experts' share
    below 1/64 of them per rank either."""
    dims = config_dims(DEEPSEEK_V3)
    plan = plan_parallelism(dims, parameters=671_000_000_000, expert_parameters=654_000_000_000)
    assert 64 in plan.valid_tps
    assert plan.recommended_tp is None and plan.ep_needed and plan.ep is None
    assert "no EP degree" in plan.reason


def test_expert_parallelism_inside_tp_for_256_experts_on_one_trn2_48xlarge():
    """EP inside the TP world of 64 ranks (vllm_neuron's layout): the EP
    degrees dividing 256 experts and 64 ranks, the experts and the width of
    each expert's slice per rank, and the memory per rank, which EP does not
    change (every rank holds 1/64 of the experts' bytes): DeepSeek-V3 in
    bf16 stays over the 20 GB budget at every degree."""
    dims = config_dims(DEEPSEEK_V3)
    plan = plan_parallelism(dims, parameters=671_000_000_000, expert_parameters=654_000_000_000)
    options = {o.ep: o for o in plan.ep_inside_tp}
    assert sorted(options) == [2, 4, 8, 16, 32, 64]
    assert all(o.tp == 64 for o in options.values())
    assert (options[8].local_experts, options[8].expert_slice) == (32, 256)
    assert (options[64].local_experts, options[64].expert_slice) == (4, 2048)
    tp64 = next(c for c in plan.checks if c.tp == 64)
    assert {o.bytes_per_rank for o in options.values()} == {tp64.bytes_per_rank}
    assert 20e9 < tp64.bytes_per_rank < 21.5e9 and not any(o.fits for o in options.values())


def test_expert_parallelism_inside_tp_needs_the_slice_to_divide():
    dims = ParallelDims(num_heads=16, num_kv_heads=8, intermediate_size=96, vocab_size=1024, num_experts=8)
    plan = plan_parallelism(dims, parameters=1_000_000, expert_parameters=800_000, world_size=8)
    # TP 8: 96 / 8 = 12 per rank; EP 2 -> 96 / 4, EP 4 -> 96 / 2, EP 8 -> 96 whole
    assert [(o.ep, o.expert_slice) for o in plan.ep_inside_tp] == [(2, 24), (4, 48), (8, 96)]
    assert all(o.fits for o in plan.ep_inside_tp)
