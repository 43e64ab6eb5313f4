"""The MoE families: every router and expert computation is a site, in the
shapes of the real packages (prefill router and blockwise experts with
cross-DP and EP branches, a decode kernel with the router fused in, a fused
router-top-k kernel) and of Hugging Face-style code (router modules,
explicit router matmuls, expert loops, shared experts)."""

from __future__ import annotations

import textwrap

import libcst as cst

from autoport_cst.transform.anatomy.census import families_of, take_census, unhandled_sites
from autoport_cst.transform.anatomy.sites import find_sites

# An experts class shaped like the real ones: the prefill routes with
# NF.router and runs NF.moe_cte on tokens gathered over the ranks (and over
# data-parallel replicas with cross-DP expert parallelism, keeping this EP
# rank's expert columns); the decode kernel normalizes, routes and runs the
# experts in one call; an all-to-all decode routes with a fused kernel first.
EXPERTS = textwrap.dedent(
    """
    class ToyExperts(nn.Module):
        def __init__(self, config):
            self.post_attention_layernorm = ToyRMSNorm(config)
            self.router_weight = nn.Parameter(torch.empty(8, 16, dtype=torch.bfloat16))

        def _run_moe_block_tkg(self, hidden_states):
            rank_id = None
            if self.ep_degree > 1:
                rank_id = torch.tensor([[self.ep_rank]], dtype=torch.int32)
            return NF.moe_block_tkg(
                inp=hidden_states.unsqueeze(0),
                router_weights=self.router_weight.T,
                rank_id=rank_id,
                router_act_fn=RouterActFnType.SOFTMAX,
                router_mm_dtype=nl.bfloat16,
            )

        def forward_decode(self, hidden_states):
            if self.all_to_all:
                normed, index, weights = NF.rmsnorm_router_topk_tkg(
                    hidden_states=hidden_states, router_weights=self.router_weight.T
                )
            output = self._run_moe_block_tkg(hidden_states)
            return self.moe_group.all_reduce(output)

        def forward_prefill(self, hidden_states, positions):
            hidden_states = self.post_attention_layernorm(hidden_states)
            affinities = NF.router(
                hidden_states=hidden_states,
                router_weights=self.router_weight.T,
                top_k=2,
                activation="softmax",
                computation_dtype=torch.float32,
            )
            if self.cross_dp_ep:
                hidden_states = self.dp_group.all_gather(hidden_states, dim=0)
            if self.ep_degree > 1:
                affinities = NF.get_local_expert_affinities(affinities, self.local_indices)
            masked, position_to_id, block_to_expert, conditions = NF.build_blockwise_mapping(
                expert_affinities=affinities, num_local_experts=4
            )
            output = NF.moe_cte(hidden_states=hidden_states, expert_affinities_masked=masked)
            return self.moe_group.reduce_scatter(output, dim=0)
    """
).lstrip()

# Hugging Face-style MoE block: a router module, an explicit matmul with a
# router weight, a loop over expert modules, a shared expert.
SPARSE_BLOCK = textwrap.dedent(
    """
    class ToySparseMoeBlock(nn.Module):
        def __init__(self, config):
            self.gate = nn.Linear(16, 8, bias=False)
            self.experts = nn.ModuleList([ToyMLP(config) for _ in range(8)])
            self.shared_expert = ToyMLP(config)
            self.score_bias_weight = None

        def forward(self, hidden_states):
            router_logits = self.gate(hidden_states)
            extra = F.linear(hidden_states.float(), self.gate.weight.float())
            out = torch.zeros_like(hidden_states)
            for expert_idx in range(8):
                expert_layer = self.experts[expert_idx]
                out = out + expert_layer(hidden_states)
                out = out + self.experts[expert_idx](hidden_states)
            return out + self.shared_expert(hidden_states)
    """
).lstrip()


def _kinds(sites):
    return sorted({(s.function, s.kind) for s in sites})


def test_every_router_of_the_real_shape_is_a_site():
    sites = find_sites(cst.parse_module(EXPERTS), "moe.router")
    assert _kinds(sites) == [
        ("_run_moe_block_tkg", "NF.moe_block_tkg"),
        ("forward_decode", "NF.rmsnorm_router_topk_tkg"),
        ("forward_prefill", "NF.router"),
    ]


def test_every_expert_kernel_of_the_real_shape_is_a_site():
    sites = find_sites(cst.parse_module(EXPERTS), "moe.experts")
    assert _kinds(sites) == [("_run_moe_block_tkg", "NF.moe_block_tkg"), ("forward_prefill", "NF.moe_cte")]
    # the cross-DP gather defines the kernel's input on one branch: one variant per branch
    cte = [s for s in sites if s.kind == "NF.moe_cte"]
    assert sorted(s.path for s in cte) == [
        (("if self.cross_dp_ep", False),),
        (("if self.cross_dp_ep", True),),
    ]


def test_hugging_face_style_routers_and_experts_are_sites():
    module = cst.parse_module(SPARSE_BLOCK)
    assert _kinds(find_sites(module, "moe.router")) == [("forward", "F.linear"), ("forward", "self.gate")]
    assert _kinds(find_sites(module, "moe.experts")) == [
        ("forward", "expert_layer"),
        ("forward", "self.experts[...]"),
        ("forward", "self.shared_expert"),
    ]


def test_helpers_getters_and_a_dense_mlp_are_not_moe_sites():
    source = textwrap.dedent(
        """
        class ToyMLP(nn.Module):
            def forward(self, x):
                return NF.mlp(x, self.gate_proj_weight, self.up_proj_weight, self.down_proj_weight)


        class ToyExperts(nn.Module):
            def forward(self, x, affinities):
                local = NF.get_local_expert_affinities(affinities, self.local_indices)
                moe_func = self._run_a if self.flag else self._run_b
                return moe_func(x) + self.router_weight.to(torch.float32).sum()
        """
    )
    module = cst.parse_module(source)
    assert find_sites(module, "moe.router") == []
    assert find_sites(module, "moe.experts") == []


def _step(before: str, after: str, family: str):
    old, new = cst.parse_module(before), cst.parse_module(after)
    return unhandled_sites(
        take_census(old, "model.py", (family,)), take_census(new, "model.py", (family,)), set()
    )


def test_a_prefill_only_router_change_leaves_the_fused_decode_router():
    edited = EXPERTS.replace('activation="softmax"', 'activation="sigmoid"')
    left = _step(EXPERTS, edited, "moe.router")
    assert {s.kind for s in left} == {"NF.moe_block_tkg", "NF.rmsnorm_router_topk_tkg"}


def test_a_router_weight_change_reaches_every_router_site():
    edited = EXPERTS.replace(
        "torch.empty(8, 16, dtype=torch.bfloat16)", "torch.empty(8, 16, dtype=torch.float32)"
    )
    assert _step(EXPERTS, edited, "moe.router") == []


def test_an_output_added_on_one_path_leaves_the_other_expert_sites():
    edited = EXPERTS.replace(
        "        output = NF.moe_cte(hidden_states=hidden_states, expert_affinities_masked=masked)\n",
        "        output = NF.moe_cte(hidden_states=hidden_states, expert_affinities_masked=masked)\n"
        "        output = output + self._shared_expert(hidden_states)\n",
    )
    assert edited != EXPERTS
    left = _step(EXPERTS, edited, "moe.experts")
    assert {s.kind for s in left} == {"NF.moe_block_tkg"}


def test_moe_fields_map_to_the_moe_families():
    assert families_of(["moe.router_activation"]) == ("moe.router",)
    assert families_of(["moe.router_dtype", "moe.routing_bias"]) == ("moe.router",)
    assert families_of(["moe.shared_experts", "moe.shared_expert_gate"]) == ("moe.experts",)
    assert families_of(["moe.dense_layers"]) == ("decoder.sublayer",)
