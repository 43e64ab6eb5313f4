"""The op-by-op substitutes the MoE codemods write into ports (``_moe_router``,
``_moe_block_tkg_unfused``) compute what the kernels they replace compute,
and apply a selection-only bias the way Hugging Face routers do."""

from __future__ import annotations

import pytest
import torch

from autoport_cst.transform.edit import moe as moe_edits
from autoport_cst.validate.standin import functional as NF
from autoport_cst.validate.standin.common_types import ActFnType, ExpertAffinityScaleMode, RouterActFnType
from autoport_cst.validate.standin.moe import MoECTEImplementation

T, H, E, I, K = 6, 16, 8, 8, 2
# the ports pass the compute dtype of their NF.moe_cte call on to the substitute
# (moe_cte's own default is bf16, as the kernel's); these checks run in fp32
COMPUTE_DTYPE = torch.float32


@pytest.fixture(scope="module")
def subs():
    namespace = {"torch": torch, "NF": NF}
    for source in moe_edits.substitute_functions({"router", "block"}):
        exec(source, namespace)  # noqa: S102 - the substitutes' own source, as written into ports
    return namespace


def _weights(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return {
        "x": torch.randn(T, H, generator=g),
        "gamma": torch.rand(1, H, generator=g) + 0.5,
        "router": torch.randn(H, E, generator=g),
        "gate_up": torch.randn(E, H, 2, I, generator=g) * 0.3,
        "down": torch.randn(E, I, H, generator=g) * 0.3,
    }


def _block_args(w, act, pre_norm, norm):
    return dict(
        inp=w["x"].unsqueeze(0),
        gamma=w["gamma"],
        router_weights=w["router"],
        expert_gate_up_weights=w["gate_up"],
        expert_down_weights=w["down"],
        top_k=K,
        eps=1e-6,
        router_act_fn=act,
        router_pre_norm=pre_norm,
        norm_topk_prob=norm,
        expert_affinities_scaling_mode=ExpertAffinityScaleMode.POST_SCALE,
        hidden_act_fn=ActFnType.SiLU,
        skip_router_logits=True,
    )


@pytest.mark.parametrize(
    "act, pre_norm, norm",
    [
        (RouterActFnType.SOFTMAX, False, False),  # the real packages: softmax over the chosen logits
        (RouterActFnType.SOFTMAX, True, False),
        (RouterActFnType.SIGMOID, False, True),
        (RouterActFnType.SIGMOID, True, False),
    ],
)
def test_the_decode_substitute_computes_the_fused_kernel(subs, act, pre_norm, norm):
    w = _weights()
    args = _block_args(w, act, pre_norm, norm)
    fused = NF.moe_block_tkg(**args)
    unfused = subs["_moe_block_tkg_unfused"](
        **args,
        implementation=MoECTEImplementation.shard_on_block,
        block_size=4,
        moe_group=None,
        tp_degree=1,
        compute_dtype=COMPUTE_DTYPE,
    )
    torch.testing.assert_close(unfused, fused, rtol=1e-4, atol=1e-4)


def test_the_decode_substitute_runs_this_ranks_experts(subs):
    w = _weights(1)
    args = _block_args(w, RouterActFnType.SOFTMAX, False, False)
    local = dict(
        args,
        expert_gate_up_weights=w["gate_up"][4:],
        expert_down_weights=w["down"][4:],
        rank_id=torch.tensor([[1]], dtype=torch.int32),
        is_all_expert=True,
    )
    fused = NF.moe_block_tkg(**local)
    unfused = subs["_moe_block_tkg_unfused"](
        **local,
        implementation=MoECTEImplementation.shard_on_block,
        block_size=4,
        moe_group=None,
        tp_degree=1,
        compute_dtype=COMPUTE_DTYPE,
    )
    torch.testing.assert_close(unfused, fused, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "activation, norm", [("softmax", True), ("softmax", False), ("sigmoid", True), ("sigmoid", False)]
)
def test_the_router_substitute_routes_like_hugging_face(subs, activation, norm):
    w = _weights(2)
    bias = torch.randn(E) * 0.5
    got = subs["_moe_router"](
        w["x"], w["router"], K, activation=activation, norm_topk_prob=norm, selection_bias=bias
    )
    logits = w["x"] @ w["router"]
    scores = logits.softmax(-1) if activation == "softmax" else logits.sigmoid()
    chosen = torch.topk(scores + bias, K, dim=-1).indices
    weights = scores.gather(-1, chosen)
    if norm:
        weights = weights / weights.sum(-1, keepdim=True)
    expected = torch.zeros_like(scores).scatter(-1, chosen, weights)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def test_without_a_selection_bias_the_router_substitute_is_nf_router(subs):
    w = _weights(3)
    got = subs["_moe_router"](w["x"], w["router"], K, activation="softmax", norm_topk_prob=True)
    torch.testing.assert_close(
        got, NF.router(w["x"], w["router"], K, activation="softmax"), rtol=1e-5, atol=1e-6
    )
