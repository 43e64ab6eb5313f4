"""Pieces of the deepseek_v3 reference against transformers' DeepSeek-V3 code,
on sizes the tiny checkpoint does not reach: YaRN with ``mscale`` and
``mscale_all_dim`` (the cos/sin factor and the softmax scale), interleaved
RoPE, and the group-limited router with its correction bias (16 experts in
4 groups, 2 groups kept)."""

from __future__ import annotations

import importlib

import pytest
import torch
from transformers import DeepseekV3Config as HFConfig
from transformers.models.deepseek_v3 import modeling_deepseek_v3 as hf

from autoport_cst.validate.package import imported_package
from autoport_cst.validate.standin import standin_installed

from .conftest import REFERENCE

YARN = {
    "rope_type": "yarn",
    "rope_theta": 10000.0,
    "factor": 40.0,
    "original_max_position_embeddings": 4096,
    "beta_fast": 32,
    "beta_slow": 1,
    "mscale": 0.707,
    "mscale_all_dim": 1.0,
}


@pytest.fixture(scope="module")
def reference():
    with standin_installed(), imported_package(REFERENCE) as package:
        yield importlib.import_module(f"{package.module.__name__}.model")


def _hf_config(**values) -> HFConfig:
    base = dict(
        hidden_size=64,
        num_attention_heads=4,
        qk_nope_head_dim=16,
        qk_rope_head_dim=64,
        v_head_dim=16,
        kv_lora_rank=32,
        q_lora_rank=None,
        max_position_embeddings=163840,
        n_routed_experts=16,
        num_experts_per_tok=4,
        n_group=4,
        topk_group=2,
    )
    return HFConfig(**{**base, **values})


@pytest.mark.parametrize("mscale", [1.0, 0.707])
def test_yarn_mscale_folds_into_the_softmax_scale_and_the_tables(reference, mscale):
    hf_config = _hf_config(rope_parameters={**YARN, "mscale": mscale})
    config = reference.DeepseekV3Config.from_configs(hf_config)
    expected_scale = hf.DeepseekV3Attention(hf_config, 0).scaling
    assert reference.softmax_scale(config) == pytest.approx(expected_scale, rel=1e-12)
    assert expected_scale != pytest.approx(config.qk_head_dim**-0.5)  # the factor is really there

    positions = torch.tensor([0, 1, 7, 4095, 50000])
    cos, sin = reference.DeepseekV3RotaryEmbedding(config)(positions, torch.device("cpu"), torch.float32)
    hf_cos, hf_sin = hf.DeepseekV3RotaryEmbedding(hf_config)(torch.zeros(1), positions.unsqueeze(0))
    torch.testing.assert_close(cos, hf_cos[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(sin, hf_sin[0], rtol=1e-5, atol=1e-6)


def test_interleaved_rope_matches_transformers(reference):
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(4, 6, 8, generator=generator)
    k = torch.randn(1, 6, 8, generator=generator)
    angles = torch.randn(6, 4, generator=generator)
    cos, sin = torch.cat((angles, angles), -1).cos(), torch.cat((angles, angles), -1).sin()
    hf_q, hf_k = hf.apply_rotary_pos_emb_interleave(q.unsqueeze(0), k.unsqueeze(0), cos[None], sin[None])
    torch.testing.assert_close(reference.apply_rope(q, cos, sin, True), hf_q[0])
    torch.testing.assert_close(reference.apply_rope(k, cos, sin, True), hf_k[0])
    hf_q, _ = hf.apply_rotary_pos_emb(q.unsqueeze(0), k.unsqueeze(0), cos[None], sin[None])
    torch.testing.assert_close(reference.apply_rope(q, cos, sin, False), hf_q[0])


@pytest.mark.parametrize("norm_topk_prob", [True, False])
def test_group_limited_router_matches_transformers(reference, norm_topk_prob):
    hf_config = _hf_config(norm_topk_prob=norm_topk_prob, routed_scaling_factor=2.5)
    router = hf.DeepseekV3TopkRouter(hf_config)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        router.weight.copy_(torch.randn(16, 64, generator=generator))
        router.e_score_correction_bias.copy_(torch.randn(16, generator=generator))
    hidden = torch.randn(50, 64, generator=generator)
    _, weights, indices = router(hidden)
    expected = torch.zeros(50, 16).scatter_(1, indices, weights)

    moe = reference.DeepseekV3MoE(reference.DeepseekV3Config.from_configs(hf_config))
    with torch.no_grad():
        moe.router_weight.copy_(router.weight)
        moe.e_score_correction_bias.copy_(router.e_score_correction_bias)
    affinities = moe._route(hidden)
    torch.testing.assert_close(affinities, expected)
    # the bias moved some choices: selection with the bias differs from selection without it
    unbiased = reference.group_limited_topk(torch.sigmoid(hidden @ router.weight.T), torch.zeros(16), 4, 4, 2)
    assert not torch.equal(unbiased.sort(-1).values, indices.sort(-1).values)
