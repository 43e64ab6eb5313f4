"""TP/EP sizing: the five rules, bf16 memory per rank, the recommended TP
and expert parallelism, on the published dimensions of public models
(fixtures/public_configs/*/config.json, written by hand; no weights)."""

from __future__ import annotations

import pytest

from autoport_cst.research.parallelism import ParallelDims, check_tp, plan_parallelism


def dims(**kw) -> ParallelDims:
    base = dict(num_heads=32, num_kv_heads=8, intermediate_size=14336, vocab_size=128256)
    return ParallelDims(**{**base, **kw})


@pytest.mark.parametrize(
    "tp, changes, rule",
    [
        (8, dict(num_heads=36), "rule 1"),
        (4, dict(num_heads=28), "rule 2"),
        (4, dict(num_kv_heads=6), "rule 3"),
        (16, dict(intermediate_size=14344), "rule 4"),
    ],
)
def test_each_rule(tp, changes, rule):
    check = check_tp(tp, dims(**changes), weight_bytes=0)
    assert not check.valid
    assert any(f.startswith(rule) for f in check.failures)


def test_kv_replication_and_vocab_padding_are_valid_with_notes():
    check = check_tp(16, dims(vocab_size=128257), weight_bytes=0)
    assert check.valid
    assert any("replicated 2x" in n for n in check.notes)
    assert any("padded to 128272" in n for n in check.notes)


def test_moe_rule_4_uses_the_expert_intermediate():
    check = check_tp(32, dims(intermediate_size=720, num_experts=128), 0)
    assert any("expert intermediate size 720" in f for f in check.failures)


def test_memory_budget_picks_the_smallest_fitting_tp():
    plan = plan_parallelism(dims(), parameters=30 * 10**9)  # 60 GB of bf16 weights
    assert plan.recommended_tp == 4  # 2 gives 30 GB per rank, 4 gives 15 GB
    assert not plan.ep_needed


@pytest.mark.parametrize(
    "name, parameters, valid, recommended",
    [
        ("llama-3.1-8b", 8_030_261_248, (1, 2, 4, 8, 16), 2),
        ("llama-3.1-70b", 70_553_706_496, (1, 2, 4, 8, 16, 32), 8),
        ("qwen3-30b-a3b", 30_532_122_624, (1, 2, 4, 8, 16), 4),
        ("gpt-oss-120b", 116_829_156_672, (1, 2, 4, 8, 16, 32), 16),
        ("qwen2.5-7b", 7_615_616_512, (1, 2), 2),
    ],
)
def test_public_models(public_research, name, parameters, valid, recommended):
    result = public_research(name)
    assert result.parameters.total == parameters  # the module tree built from the config
    assert result.parallel.valid_tps == valid
    assert result.parallel.recommended_tp == recommended
    assert not result.parallel.ep_needed


def test_public_model_rule_failures(public_research):
    llama = public_research("llama-3.1-8b").parallel
    assert any("rule 2: 1 heads per rank is odd" in f for c in llama.checks if c.tp == 32 for f in c.failures)
    qwen = public_research("qwen2.5-7b").parallel
    assert any("rule 2: 7 heads per rank is odd" in f for c in qwen.checks if c.tp == 4 for f in c.failures)
    oss = public_research("gpt-oss-120b").parallel
    eight = next(c for c in oss.checks if c.tp == 8)
    assert eight.valid and not eight.fits  # 29 GB per rank
    assert any("rule 2" in f for c in oss.checks if c.tp == 64 for f in c.failures)


def test_mixtral_8x22b_needs_expert_parallelism(public_research):
    result = public_research("mixtral-8x22b")
    plan = result.parallel
    assert plan.valid_tps == (1, 2, 4, 8)  # 48 heads: 16 gives 3 per rank
    assert plan.recommended_tp is None
    assert plan.ep_needed
    assert (plan.ep.tp, plan.ep.ep, plan.ep.local_experts) == (8, 8, 1)
    assert plan.ep.tp * plan.ep.ep == 64
    assert plan.ep.fits
    assert result.parameters.experts == 56 * 8 * 3 * 6144 * 16384


def test_public_specs(public_research):
    oss = public_research("gpt-oss-120b")
    assert oss.spec.attention.sliding_window == "per_layer"
    assert oss.spec.rope.type == "yarn"
    assert oss.spec.moe.num_experts == 128 and oss.spec.moe.top_k == 4
    assert any("quantized" in p for p in oss.pitfalls)
    llama = public_research("llama-3.1-8b")
    assert llama.spec.rope.type == "llama3"
    assert llama.spec.rope.parameters["factor"] == 8.0
    assert llama.decision("rope.type").evidence.startswith("rope_scaling")
    qwen = public_research("qwen2.5-7b")
    assert qwen.spec.attention.sliding_window == "none"  # use_sliding_window is false
    assert qwen.finding("config.sliding_window_unused") is not None
    moe = public_research("qwen3-30b-a3b")
    assert moe.spec.moe.intermediate_size == 768 and moe.spec.attention.head_dim == 128


@pytest.mark.parametrize(
    "config",
    [
        {"n_heads": 32, "vocab_size": 50432},  # MPT's config.json
        {"attention_heads": 32, "vocab_size": 256008},  # XGLM's
    ],
)
def test_head_counts_under_the_configs_own_names(config):
    """The rules (and the DCP layouts' check) read the head count under the
    name the config writes; without it they checked nothing (any TP taken)."""
    from autoport_cst.research.parallelism import config_dims, tp_refusal

    dims = config_dims(config)
    assert dims is not None and (dims.num_heads, dims.num_kv_heads) == (32, 32)
    assert tp_refusal(config, 3) is not None


@pytest.mark.parametrize(
    ("config", "kv_heads"),
    [
        # Falcon-7B: multi-query attention, one KV head whatever num_kv_heads says
        ({"num_attention_heads": 71, "num_kv_heads": 71, "multi_query": True}, 1),
        # Falcon-40B's new decoder architecture takes num_kv_heads; its config class writes multi_query true
        (
            {
                "num_attention_heads": 128,
                "num_kv_heads": 8,
                "multi_query": True,
                "new_decoder_architecture": True,
            },
            8,
        ),
        ({"num_attention_heads": 4, "num_kv_heads": 4, "multi_query": False}, 4),
    ],
)
def test_kv_heads_as_falcons_layers_build_them(config, kv_heads):
    """Before, a Falcon-40B config was read as one KV head: the TP rules and the
    DCP layouts' check took layouts its 2 KV heads (tiny) cannot: the port of
    the published Falcon-40B config failed at 'TP=2, DCP 2 with a
    context-parallel prefill' (prefill and decode graphs asking for different
    KV caches), a layout that needs one KV head."""
    from autoport_cst.research.parallelism import config_dims
    from autoport_cst.validate.dcp_layouts import PREFILL, _takes

    dims = config_dims({**config, "vocab_size": 512})
    assert dims is not None and dims.num_kv_heads == kv_heads
    tiny = {**config, "num_attention_heads": 4, "vocab_size": 512}
    if config.get("new_decoder_architecture"):
        assert not _takes(PREFILL[1], {**tiny, "num_kv_heads": 2})  # 2 KV heads x DCP 2 > TP 2
