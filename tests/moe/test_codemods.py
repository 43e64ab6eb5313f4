"""Properties of the mixture-of-experts codemods on sources in the shape of
the qwen3_moe reference: idempotent, compiling output, independent of the
order they run in (with each other and with the codemods a MoE port also
uses), and the edits each one promises."""

from __future__ import annotations

import functools
import json

import libcst as cst
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoport_cst.errors import PreconditionError
from autoport_cst.transform.base import PortContext, run_on_source
from autoport_cst.transform.library import get_codemod

from .moe_sources import moe_sources, reduced_source

MOE_PARAMS = {
    "router-activation": st.sampled_from([{"activation": "sigmoid"}, {"activation": "softmax"}]),
    "router-bias": st.just({}),
    "routing-bias": st.just({}),
    "shared-experts": st.sampled_from([{"gate": True}, {"gate": False}]),
    "remove-qk-norm": st.just({}),
    "routed-scaling": st.just({}),
}
OTHERS = {
    "add-qkv-bias": st.just({"qkv": True}),
    "float32-router": st.just({}),
}
FEW = settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def apply(codemod_id: str, params: dict, source: str) -> str:
    """``codemod_id`` run on ``source``, its output compiled. Kept by content
    (the codemod, its parameters and the source's text): the orders and
    examples of this module run the same codemod on the same text again and
    again (a permutation's prefix, the reference in sorted order, a drawn
    prefix), and a codemod's output depends on nothing else."""
    return _apply(codemod_id, json.dumps(params, sort_keys=True), source)


@functools.lru_cache(maxsize=1024)
def _apply(codemod_id: str, params: str, source: str) -> str:
    cls = get_codemod(codemod_id)
    output, _ = run_on_source(
        cls(cls.parse_params(json.loads(params))), source, "model.py", "model", PortContext()
    )
    compile(output, "model.py", "exec")
    return output


@pytest.mark.parametrize("codemod_id", sorted(MOE_PARAMS))
@FEW
@given(data=st.data(), generated=moe_sources())
def test_idempotent_and_compiles(codemod_id, data, generated):
    _, source = generated
    params = data.draw(MOE_PARAMS[codemod_id])
    once = apply(codemod_id, params, source)
    assert once != source or codemod_id == "router-activation" and params["activation"] == "softmax"
    assert apply(codemod_id, params, once) == once


@FEW
@given(data=st.data(), generated=moe_sources())
def test_every_order_gives_the_same_port(data, generated):
    _, source = generated
    ids = data.draw(
        st.lists(st.sampled_from(sorted(MOE_PARAMS) + sorted(OTHERS)), min_size=2, max_size=4, unique=True)
    )
    params = {i: data.draw({**MOE_PARAMS, **OTHERS}[i]) for i in ids}
    order = data.draw(st.permutations(ids))

    def run(sequence):
        text = source
        for codemod_id in sequence:
            text = apply(codemod_id, params[codemod_id], text)
        return text

    assert run(ids) == run(order)


def test_reference_edits():
    """What each codemod promises, on the reference's own experts class."""
    source = reduced_source()
    sigmoid = apply("router-activation", {"activation": "sigmoid"}, source)
    assert 'activation="sigmoid"' in sigmoid and "scores = torch.sigmoid(router_logits)" in sigmoid
    assert "router_act_fn=RouterActFnType.SIGMOID" in sigmoid

    bias = apply("router-bias", {}, source)
    assert "router_bias=self.router_bias," in bias and "router_bias=self.router_bias.unsqueeze(0)" in bias
    assert 'mappings[f"{prefix}.mlp.experts.router_bias"] = f"{moe.router}.bias"' in bias

    routing = apply("routing-bias", {}, source)
    assert "self.fused_decode = False" in routing
    assert "torch.topk(scores + self.routing_bias, self.num_experts_per_token, dim=-1).indices" in routing
    assert '_routing_bias_key(names, moe.router, moe.module, "e_score_correction_bias")' in routing

    shared = apply("shared-experts", {"gate": True}, source)
    assert "output = output + self._shared_expert(hidden_states)" in shared
    assert "output = output + self._shared_expert(self.post_attention_layernorm(hidden_states))" in shared
    assert 'f"{moe.module}.shared_expert_gate.weight"' in shared

    plain = apply("remove-qk-norm", {}, source)
    assert "q_norm" not in plain and "k_norm" not in plain
    assert "rmsnorm_QK_pre_rope_enabled=False" in plain


def test_routing_bias_needs_the_logits():
    source = reduced_source().replace("selected, router_logits = NF.router(", "selected = NF.router(")
    with pytest.raises(PreconditionError, match="cannot apply a selection-only bias"):
        apply("routing-bias", {}, source)


def test_shared_experts_names_what_is_missing():
    reduce = "output = self.moe_group.all_reduce(output)"
    assert reduce in reduced_source()
    source = reduced_source().replace(reduce, "output = output")
    with pytest.raises(PreconditionError, match="forward_decode of .*Experts has no all-reduce"):
        apply("shared-experts", {"gate": True}, source)


def test_config_gains_the_shared_expert_field():
    from .conftest import QWEN3_MOE

    cls = get_codemod("shared-experts")
    config = (QWEN3_MOE / "config.py").read_text(encoding="utf-8")
    output, _ = run_on_source(
        cls(cls.parse_params({"gate": True})), config, "config.py", "config", PortContext()
    )
    cst.parse_module(output)
    assert "    shared_expert_intermediate_size: int | None = None\n" in output


# codemods that edit more of the reference than the reduced source holds (the
# MoE wrapper, the decoder layer, the config): run on the whole model file
FULL_PARAMS = {
    "dense-layers": {},
    "routed-scaling": {},
    "routing-bias": {},
    "shared-experts": {"gate": False},
    "router-activation": {"activation": "sigmoid"},
    "remove-qk-norm": {},
}


def _run_on_reference(sequence) -> str:
    from .moe_sources import reference_source

    text = reference_source()
    for codemod_id in sequence:
        text = apply(codemod_id, FULL_PARAMS[codemod_id], text)
    return text


@functools.cache
def _reference_in_sorted_order() -> str:
    """The reference with FULL_PARAMS applied in sorted order (once per session)."""
    return _run_on_reference(sorted(FULL_PARAMS))


def test_full_codemods_on_the_reference_are_idempotent_and_edit():
    first = _reference_in_sorted_order()
    for codemod_id in FULL_PARAMS:
        assert apply(codemod_id, FULL_PARAMS[codemod_id], first) == first
    assert (
        "self.mlp = Qwen3MoeDenseMLP(config) if _layer_is_dense(config, layer_idx) else Qwen3MoeMLP(config)"
        in first
    )
    assert "affinities = affinities * self.routed_scaling_factor" in first
    assert "output = output * self.routed_scaling_factor" in first


@FEW
@given(order=st.permutations(sorted(FULL_PARAMS)))
def test_dense_layers_and_routed_scaling_commute_on_the_reference(order):
    assert _run_on_reference(order) == _reference_in_sorted_order()


def _class_source(source: str, name: str) -> str:
    module = cst.parse_module(source)
    found = [s for s in module.body if isinstance(s, cst.ClassDef) and s.name.value == name]
    assert len(found) == 1, name
    return module.code_for_node(found[0])


def test_dense_layers_follows_the_real_wrapper_signature():
    """The reference's MoE wrapper takes (hidden_states, positions, is_decode,
    rank), decode rows in the MLP-DP state: the dense MLP takes the same and
    shards over, and sums its decode partial outputs over, the MLP TP group
    (TP * MLP DP); prefill keeps the SP gather and reduce-scatter over TP."""
    from .moe_sources import reference_source

    output = apply("dense-layers", {}, reference_source())
    dense = _class_source(output, "Qwen3MoeDenseMLP")
    signature = "self,\n        hidden_states: torch.Tensor,\n        positions: torch.Tensor,\n"
    assert f"def forward(\n        {signature}        is_decode: bool,\n" in dense
    assert "rank: torch.Tensor | None = None," in dense
    width = "(config.intermediate_size_mlp or config.intermediate_size)"  # Llama 4's dense width when given
    assert f"self.intermediate_size_per_rank = {width} // self.mlp_tp_size" in dense
    assert "with_rank_override(gate_up_loader, rank=self.mlp_tp_rank)" in dense
    assert "output = self.mlp_tp_group.all_reduce(output)" in dense
    assert "if not is_decode and self.world_size > 1:" in dense
    assert "output = self.tp_group.reduce_scatter(output, dim=0)" in dense
    assert "is_prefill" not in dense
    # the decoder layer calls it as it calls the wrapper
    assert "self.mlp(hidden_states, positions=positions, is_decode=True, rank=rank)" in output


def test_dense_layers_refuses_a_wrapper_signature_it_has_no_dense_class_for():
    from .moe_sources import reference_source

    source = reference_source().replace(
        "return self.experts(\n            hidden_states.to(self.dtype), positions=positions, is_decode=is_decode, rank=rank",
        "return self.experts(\n            hidden_states.to(self.dtype), positions=positions, is_decode=phase, rank=rank",
    )
    source = source.replace(
        "        positions: torch.Tensor,\n        is_decode: bool,\n        rank: torch.Tensor | None = None,\n"
        "    ) -> torch.Tensor:\n        return self.experts(",
        "        positions: torch.Tensor,\n        phase: bool,\n        rank: torch.Tensor | None = None,\n"
        "    ) -> torch.Tensor:\n        return self.experts(",
    )
    assert "is_decode=phase" in source and "        phase: bool,\n" in source
    with pytest.raises(PreconditionError) as refused:
        apply("dense-layers", {}, source)
    message = str(refused.value)
    assert "Qwen3MoeMLP.forward takes (hidden_states, positions, phase, rank)" in message
    assert "(hidden_states, positions, is_decode, rank)" in message


def test_sliding_window_makes_the_backbone_mask_one_per_window():
    """The reference's backbone builds one decode mask per step, without a
    window, for every layer: once layers slide, it builds one per window of
    the layers (still once per step) and hands each layer its own."""
    from .moe_sources import reference_source

    params = {"layers": "per_layer"}
    output = apply("sliding-window", params, reference_source())
    assert apply("sliding-window", params, output) == output
    assert (
        "def _precompute_decode_attn_mask(attn_metadata, positions: torch.Tensor, q_heads: int, "
        "window: int | None = None)" in output
    )
    assert (
        "start_pos = torch.clamp(positions.reshape(1, local_batch * new_tokens).to(torch.float32) - (window - 1)"
        in output
    )
    assert "start_pos=start_pos," in output
    assert (
        "attn_mask = {window: _precompute_decode_attn_mask(attn_metadata, positions, "
        "self.layers[0].self_attn.num_q_heads_after_a2a, window) for window in "
        "{layer.self_attn.sliding_window for layer in self.layers}}" in output
    )
    assert "attn_mask=None if attn_mask is None else attn_mask[layer.self_attn.sliding_window]," in output


def test_config_edits_commute():
    from .conftest import QWEN3_MOE

    config = (QWEN3_MOE / "config.py").read_text(encoding="utf-8")
    ids = ["dense-layers", "routed-scaling", "shared-experts"]
    params = {"dense-layers": {}, "routed-scaling": {}, "shared-experts": {"gate": False}}

    def run(sequence):
        text = config
        for codemod_id in sequence:
            cls = get_codemod(codemod_id)
            text, _ = run_on_source(
                cls(cls.parse_params(params[codemod_id])), text, "config.py", "config", PortContext()
            )
        return text

    forward, backward = run(ids), run(list(reversed(ids)))
    assert forward == backward
    compile(forward, "config.py", "exec")
    assert '"routed_scaling_factor": ("routed_scaling_factor", "router_scaling_factor"),' in forward
    assert "    first_k_dense_replace: int | None = None\n" in forward
