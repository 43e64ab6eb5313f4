"""The CPU stand-in's mixture-of-experts ops compute what their documented
semantics say, and refuse the arguments the device kernels refuse."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from autoport_cst.validate.standin import functional as NF
from autoport_cst.validate.standin.common_types import (
    ActFnType,
    ExpertAffinityScaleMode,
    RouterActFnType,
)
from autoport_cst.validate.standin.functional import KernelConstraintError
from autoport_cst.validate.standin.moe import MoECTEImplementation, RouterComputationOrder

T, H, E, I, K = 7, 16, 4, 8, 2


@pytest.fixture
def data():
    g = torch.Generator().manual_seed(0)
    return {
        "x": torch.randn(T, H, generator=g),
        "w": torch.randn(H, E, generator=g),
        "bias": torch.randn(E, generator=g),
        "gate_up": torch.randn(E, H, 2, I, generator=g) * 0.3,
        "down": torch.randn(E, I, H, generator=g) * 0.3,
        "gamma": torch.randn(H, generator=g),
    }


def dense_moe(x, affinities, gate_up, down, act=F.silu):
    """Reference: every expert on every token, weighted by its affinity."""
    out = torch.zeros_like(x)
    for e in range(gate_up.shape[0]):
        y = (act(x @ gate_up[e, :, 0]) * (x @ gate_up[e, :, 1])) @ down[e]
        out += y * affinities[:, e : e + 1]
    return out


def test_router_default_order_is_softmax_over_the_top_k(data):
    affinities = NF.router(data["x"], data["w"], top_k=K)
    logits = data["x"] @ data["w"]
    values, indices = torch.topk(logits, K, dim=-1)
    expected = torch.zeros(T, E).scatter(1, indices, torch.softmax(values, -1))
    torch.testing.assert_close(affinities, expected)
    assert affinities.dtype == torch.float32
    assert ((affinities > 0).sum(-1) == K).all()


def test_router_orders_bias_and_logits(data):
    x, w, b = data["x"], data["w"], data["bias"]
    logits = x @ w + b
    affinities, returned = NF.router(
        x,
        w,
        top_k=K,
        router_bias=b,
        activation="sigmoid",
        return_logits=True,
        router_computation_order=RouterComputationOrder.PRENORM_LINEAR_ACT_TOPK_RENORM_SCATTER,
    )
    torch.testing.assert_close(returned, logits)
    values, indices = torch.topk(torch.sigmoid(logits), K, dim=-1)
    expected = torch.zeros(T, E).scatter(1, indices, values / values.sum(-1, keepdim=True))
    torch.testing.assert_close(affinities, expected)
    sparse = NF.router(
        x,
        w,
        top_k=K,
        router_bias=b,
        activation="sigmoid",
        router_computation_order=RouterComputationOrder.PRENORM_LINEAR_TOPK_SCATTER_ACT,
    )
    values, indices = torch.topk(logits, K, dim=-1)
    torch.testing.assert_close(sparse, torch.zeros(T, E).scatter(1, indices, torch.sigmoid(values)))


def test_router_float32_from_bf16_inputs(data):
    x = data["x"].to(torch.bfloat16)
    affinities = NF.router(x, data["w"], top_k=K, computation_dtype=torch.float32)
    expected = NF.router(x.float(), data["w"], top_k=K)
    assert affinities.dtype == torch.float32
    torch.testing.assert_close(affinities, expected)


def test_router_refuses_a_2d_bias(data):
    with pytest.raises(KernelConstraintError, match=r"router_bias shape \[E\]"):
        NF.router(data["x"], data["w"], top_k=K, router_bias=data["bias"].unsqueeze(0))


def test_blockwise_mapping_groups_tokens_by_expert(data):
    affinities = NF.router(data["x"], data["w"], top_k=K)
    block = 4
    masked, positions, block_to_expert, conditions = NF.build_blockwise_mapping(
        affinities, num_local_experts=E, num_experts_per_token=K, block_size=block
    )
    assert masked.shape == (T * E, 1)
    torch.testing.assert_close(masked.view(T, E), affinities)
    assert positions.dtype == torch.int32 and block_to_expert.dtype == torch.int32
    blocks = positions.numel() // block
    assert block_to_expert.shape == (blocks,) and conditions.shape == (blocks,)
    seen = set()
    for n in range(blocks):
        ids = [int(t) for t in positions[n * block : (n + 1) * block] if t >= 0]
        assert bool(conditions[n]) == bool(ids)
        for t in ids:
            assert affinities[t, int(block_to_expert[n])] > 0
            seen.add((t, int(block_to_expert[n])))
    assert seen == {(t, e) for t in range(T) for e in range(E) if affinities[t, e] > 0}


def test_blockwise_mapping_drops_padding_tokens(data):
    affinities = NF.router(data["x"], data["w"], top_k=K)
    mask = torch.arange(T) < T - 2
    masked, *_ = NF.build_blockwise_mapping(affinities, E, K, 4, padding_mask=mask)
    assert (masked.view(T, E)[T - 2 :] == 0).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_moe_cte_matches_a_dense_loop(data, dtype):
    affinities = NF.router(data["x"], data["w"], top_k=K)
    masked, positions, block_to_expert, conditions = NF.build_blockwise_mapping(affinities, E, K, 256)
    out = NF.moe_cte(
        hidden_states=data["x"].to(dtype),
        expert_affinities_masked=masked,
        gate_up_proj_weight=data["gate_up"].to(dtype),
        down_proj_weight=data["down"].to(dtype),
        token_position_to_id=positions,
        block_to_expert=block_to_expert,
        block_size=256,
        implementation=MoECTEImplementation.shard_on_block,
        conditions=conditions,
        activation_function=ActFnType.SiLU,
        skip_token=True,
        expert_affinities_scaling_mode=ExpertAffinityScaleMode.POST_SCALE,
        compute_dtype=dtype,
    )
    expected = dense_moe(data["x"], affinities, data["gate_up"], data["down"])
    assert out.dtype == dtype
    tolerance = 1e-5 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(out.float(), expected, atol=tolerance, rtol=tolerance)


def dense_moe_pre_scaled(x, affinities, gate_up, down, act=F.silu):
    """Reference of PRE_SCALE: every expert on every token scaled by its
    affinity (Llama 4's experts(x * score)), the outputs summed unweighted;
    an expert a token does not use reads zeros and adds nothing."""
    out = torch.zeros_like(x)
    for e in range(gate_up.shape[0]):
        xs = x * affinities[:, e : e + 1]
        out += (act(xs @ gate_up[e, :, 0]) * (xs @ gate_up[e, :, 1])) @ down[e]
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_moe_cte_pre_scale_weighs_the_expert_inputs(data, dtype):
    """PRE_SCALE: each block's rows are multiplied by their affinities
    before the gate/up projection and the outputs are accumulated
    unweighted; not the POST_SCALE result (the experts are not linear)."""
    affinities = NF.router(data["x"], data["w"], top_k=K)
    masked, positions, block_to_expert, conditions = NF.build_blockwise_mapping(affinities, E, K, 256)

    def run(mode):
        return NF.moe_cte(
            hidden_states=data["x"].to(dtype),
            expert_affinities_masked=masked,
            gate_up_proj_weight=data["gate_up"].to(dtype),
            down_proj_weight=data["down"].to(dtype),
            token_position_to_id=positions,
            block_to_expert=block_to_expert,
            block_size=256,
            implementation=MoECTEImplementation.shard_on_block,
            conditions=conditions,
            skip_token=True,
            expert_affinities_scaling_mode=mode,
            compute_dtype=dtype,
        )

    out = run(ExpertAffinityScaleMode.PRE_SCALE)
    expected = dense_moe_pre_scaled(data["x"], affinities, data["gate_up"], data["down"])
    tolerance = 1e-5 if dtype == torch.float32 else 3e-2
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), expected, atol=tolerance, rtol=tolerance)
    post = run(ExpertAffinityScaleMode.POST_SCALE).float()
    assert (post - expected).abs().max() > 5 * tolerance


def test_moe_block_tkg_refuses_pre_scale_as_the_kernel_does(data):
    with pytest.raises(KernelConstraintError, match="does not support pre-scale"):
        NF.moe_block_tkg(
            inp=data["x"],
            gamma=data["gamma"].unsqueeze(0),
            router_weights=data["w"],
            expert_gate_up_weights=data["gate_up"],
            expert_down_weights=data["down"],
            top_k=K,
            expert_affinities_scaling_mode=ExpertAffinityScaleMode.PRE_SCALE,
        )


@pytest.mark.parametrize(
    "mode", [ExpertAffinityScaleMode.PRE_SCALE_DELAYED, ExpertAffinityScaleMode.NO_SCALE]
)
def test_moe_cte_refuses_the_modes_it_does_not_compute(data, mode):
    """PRE_SCALE_DELAYED (affinities between the gate/up matmul and the
    activation, in the kernel's documentation) and NO_SCALE are refused,
    naming the mode, never computed as another mode."""
    affinities = NF.router(data["x"], data["w"], top_k=K)
    masked, positions, block_to_expert, conditions = NF.build_blockwise_mapping(affinities, E, K, 256)
    with pytest.raises(NotImplementedError, match=f"expert_affinities_scaling_mode {mode}"):
        NF.moe_cte(
            hidden_states=data["x"],
            expert_affinities_masked=masked,
            gate_up_proj_weight=data["gate_up"],
            down_proj_weight=data["down"],
            token_position_to_id=positions,
            block_to_expert=block_to_expert,
            block_size=256,
            implementation=MoECTEImplementation.shard_on_block,
            conditions=conditions,
            skip_token=True,
            expert_affinities_scaling_mode=mode,
        )


def test_moe_block_tkg_refuses_pre_scale_delayed(data):
    with pytest.raises(NotImplementedError, match="PRE_SCALE_DELAYED"):
        NF.moe_block_tkg(
            inp=data["x"],
            gamma=data["gamma"].unsqueeze(0),
            router_weights=data["w"],
            expert_gate_up_weights=data["gate_up"],
            expert_down_weights=data["down"],
            top_k=K,
            expert_affinities_scaling_mode=ExpertAffinityScaleMode.PRE_SCALE_DELAYED,
        )


def test_moe_cte_computes_in_bfloat16_unless_told(data):
    """The kernel's documented ``compute_dtype`` default is ``nl.bfloat16``:
    left out, float32 hidden states still go through the experts in bf16."""
    affinities = NF.router(data["x"], data["w"], top_k=K)
    masked, positions, block_to_expert, conditions = NF.build_blockwise_mapping(affinities, E, K, 256)

    def run(**options):
        return NF.moe_cte(
            hidden_states=data["x"],
            expert_affinities_masked=masked,
            gate_up_proj_weight=data["gate_up"],
            down_proj_weight=data["down"],
            token_position_to_id=positions,
            block_to_expert=block_to_expert,
            block_size=256,
            implementation=MoECTEImplementation.shard_on_block,
            conditions=conditions,
            skip_token=True,
            **options,
        )

    default = run()
    assert default.dtype == torch.float32
    assert torch.equal(default, run(compute_dtype=torch.bfloat16))
    assert not torch.equal(default, run(compute_dtype=torch.float32))
    assert torch.equal(run(compute_dtype=None), run(compute_dtype=torch.float32))  # None: the input's dtype


def test_moe_cte_refuses_a_flat_gate_up_weight(data):
    affinities = NF.router(data["x"], data["w"], top_k=K)
    masked, positions, block_to_expert, _ = NF.build_blockwise_mapping(affinities, E, K, 256)
    with pytest.raises(KernelConstraintError, match=r"\[E, H=16, 2, I\]"):
        NF.moe_cte(
            hidden_states=data["x"],
            expert_affinities_masked=masked,
            gate_up_proj_weight=data["gate_up"].reshape(E, H, 2 * I),
            down_proj_weight=data["down"],
            token_position_to_id=positions,
            block_to_expert=block_to_expert,
            block_size=256,
            implementation=MoECTEImplementation.shard_on_block,
        )


def test_moe_block_tkg_is_norm_router_and_experts(data):
    x, gamma = data["x"], data["gamma"]
    normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * gamma
    for act, pre_norm, renorm in [
        (RouterActFnType.SOFTMAX, True, False),
        (RouterActFnType.SOFTMAX, True, True),
        (RouterActFnType.SIGMOID, True, True),
        (RouterActFnType.SIGMOID, False, False),
    ]:
        out = NF.moe_block_tkg(
            inp=x.unsqueeze(0),
            gamma=gamma.unsqueeze(0),
            router_weights=data["w"],
            expert_gate_up_weights=data["gate_up"],
            expert_down_weights=data["down"],
            top_k=K,
            eps=1e-6,
            router_act_fn=act,
            router_pre_norm=pre_norm,
            norm_topk_prob=renorm,
            router_bias=data["bias"].unsqueeze(0),
            expert_affinities_scaling_mode=ExpertAffinityScaleMode.POST_SCALE,
            skip_router_logits=True,
        )
        logits = normed @ data["w"] + data["bias"]
        score = torch.softmax if act is RouterActFnType.SOFTMAX else torch.sigmoid
        if pre_norm:
            values, indices = torch.topk(
                score(logits, -1) if score is torch.softmax else score(logits), K, dim=-1
            )
        else:
            values, indices = torch.topk(logits, K, dim=-1)
            values = score(values, -1) if score is torch.softmax else score(values)
        if renorm:
            values = values / values.sum(-1, keepdim=True)
        affinities = torch.zeros(T, E).scatter(1, indices, values)
        torch.testing.assert_close(out, dense_moe(normed, affinities, data["gate_up"], data["down"]))


def test_moe_block_tkg_refuses_a_1d_router_bias(data):
    with pytest.raises(KernelConstraintError, match=r"Bias shape must be \[1, 4\]"):
        NF.moe_block_tkg(
            inp=data["x"],
            gamma=data["gamma"].unsqueeze(0),
            router_weights=data["w"],
            expert_gate_up_weights=data["gate_up"],
            expert_down_weights=data["down"],
            top_k=K,
            router_bias=data["bias"],
        )


def test_moe_block_tkg_local_experts_need_an_int32_rank(data):
    kwargs = dict(
        inp=data["x"],
        gamma=data["gamma"].unsqueeze(0),
        router_weights=data["w"],
        expert_gate_up_weights=data["gate_up"][2:],
        expert_down_weights=data["down"][2:],
        top_k=K,
        expert_affinities_scaling_mode=ExpertAffinityScaleMode.POST_SCALE,
        skip_router_logits=True,
        is_all_expert=True,
    )
    with pytest.raises(KernelConstraintError, match="rank_id"):
        NF.moe_block_tkg(**kwargs)
    # the selective-expert mode looks global expert ids up in the weights: it needs all of them
    with pytest.raises(KernelConstraintError, match="selective-expert mode"):
        NF.moe_block_tkg(**{**kwargs, "is_all_expert": False}, rank_id=torch.ones(1, 1, dtype=torch.int32))
    upper = NF.moe_block_tkg(**kwargs, rank_id=torch.ones(1, 1, dtype=torch.int32))
    lower = NF.moe_block_tkg(
        **{**kwargs, "expert_gate_up_weights": data["gate_up"][:2], "expert_down_weights": data["down"][:2]},
        rank_id=torch.zeros(1, 1, dtype=torch.int32),
    )
    full = NF.moe_block_tkg(
        **{
            **kwargs,
            "expert_gate_up_weights": data["gate_up"],
            "expert_down_weights": data["down"],
            "is_all_expert": False,
        }
    )
    torch.testing.assert_close(upper + lower, full)


def test_local_expert_affinities_are_columns(data):
    affinities = NF.router(data["x"], data["w"], top_k=K)
    local = NF.get_local_expert_affinities(affinities, torch.tensor([2, 3], dtype=torch.int32))
    torch.testing.assert_close(local, affinities[:, 2:])


def test_the_stand_in_installs_the_moe_modules():
    import importlib
    import sys

    from autoport_cst.validate.standin import standin_installed

    with standin_installed():
        nl = importlib.import_module("nki.language")
        moe_cte = importlib.import_module("nkilib.core.moe.moe_cte.moe_cte")
        assert nl.float32 is torch.float32
        assert moe_cte.MoECTEImplementation.shard_on_block is MoECTEImplementation.shard_on_block
        assert sys.modules["vllm_neuron.functional"].router is NF.router
    assert "nki.language" not in sys.modules or not getattr(
        sys.modules["nki.language"], "__autoport_standin__", False
    )
