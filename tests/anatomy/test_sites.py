"""The locator layer: every site of a family, per path, and footprints that
change exactly when a site's computation is edited."""

from __future__ import annotations

import textwrap

import libcst as cst

from autoport_cst.transform.anatomy.census import take_census, unhandled_sites
from autoport_cst.transform.anatomy.sites import find_sites

# An attention class shaped like the real packages: three prefill kernels
# chosen by branches, and a decode kernel whose mask comes from one of two
# branches (the bounded-gather path builds none).
ATTENTION = textwrap.dedent(
    """
    class LlamaAttention(nn.Module):
        def __init__(self, config, layer_idx):
            self.scaling = config.head_dim**-0.5
            self.qkv_proj_weight = nn.Parameter(torch.empty(8, 8))
            set_weight_loader(self.qkv_proj_weight, fused_qkv_weight_loader(q_size=4))

        def forward(self, hidden_states, positions, position_embeddings, attn_metadata):
            if attn_metadata is None:
                return self.forward_decode(hidden_states, positions, position_embeddings, attn_metadata)
            return self.forward_prefill(hidden_states, positions, position_embeddings, attn_metadata)

        def forward_prefill(self, hidden_states, positions, position_embeddings, attn_metadata):
            cos, sin = position_embeddings
            q = NF.qkv_proj(hidden=hidden_states, qkv_weights=self.qkv_proj_weight, cos_cache=cos)
            if self.dcp_size > 1:
                out = NF.segmented_attention_cp(q, scale=self.scaling)
            elif attn_metadata["kv_segment_size"]:
                out = NF.segmented_attention(q, scale=self.scaling)
            else:
                out = NF.flash_attention(q, q, q, scale=self.scaling)
            return NF.o_proj(out, self.o_proj_weight, None)

        def forward_decode(self, hidden_states, positions, position_embeddings, attn_metadata):
            if self.bounded_gather:
                mask = None
            else:
                mask = NF.gen_attention_decode_mask(pos_ids=positions, start_pos=None)
            return NF.attention_decode(
                X=hidden_states, W_qkv=self.qkv_proj_weight, attention_mask=mask, softmax_scale=self.scaling
            )
    """
).lstrip()


def _kinds(sites):
    return sorted({(s.function, s.kind) for s in sites})


def test_every_attention_kernel_is_a_site():
    sites = find_sites(cst.parse_module(ATTENTION), "attention.kernel")
    assert _kinds(sites) == [
        ("forward_decode", "NF.attention_decode"),
        ("forward_prefill", "NF.flash_attention"),
        ("forward_prefill", "NF.segmented_attention"),
        ("forward_prefill", "NF.segmented_attention_cp"),
    ]


def test_a_site_fed_by_two_branches_has_one_variant_per_branch():
    decode = [
        s
        for s in find_sites(cst.parse_module(ATTENTION), "attention.kernel")
        if s.function == "forward_decode"
    ]
    assert sorted(s.path for s in decode) == [
        (("if self.bounded_gather", False),),
        (("if self.bounded_gather", True),),
    ]
    assert any("not (if self.bounded_gather)" in s.describe() for s in decode)


def test_getters_classes_and_init_are_not_kernel_sites():
    source = textwrap.dedent(
        """
        class LlamaDecoderLayer(nn.Module):
            def __init__(self, config):
                self.group = get_neuron_attention_dp_group()
                self.self_attn = LlamaAttention(config)

            def forward(self, x):
                return self.self_attn(x)
        """
    )
    assert find_sites(cst.parse_module(source), "attention.kernel") == []
    assert _kinds(find_sites(cst.parse_module(source), "decoder.sublayer")) == [("forward", "self.self_attn")]


def _step(before: str, after: str, family: str):
    old, new = cst.parse_module(before), cst.parse_module(after)
    return unhandled_sites(
        take_census(old, "model.py", (family,)), take_census(new, "model.py", (family,)), set()
    )


def test_a_kernel_left_alone_is_unhandled():
    edited = ATTENTION.replace(
        "NF.flash_attention(q, q, q, scale=self.scaling)",
        "NF.flash_attention(q, q, q, scale=self.scaling, sliding_window=self.sliding_window)",
    )
    left = _step(ATTENTION, edited, "attention.kernel")
    assert sorted({s.kind for s in left}) == [
        "NF.attention_decode",
        "NF.segmented_attention",
        "NF.segmented_attention_cp",
    ]


def test_an_edit_on_one_branch_leaves_the_other_path_unhandled():
    edited = ATTENTION.replace("start_pos=None", "start_pos=window_start(positions)")
    left = [s for s in _step(ATTENTION, edited, "attention.kernel") if s.kind == "NF.attention_decode"]
    assert [s.path for s in left] == [(("if self.bounded_gather", True),)]


def test_a_shared_input_changed_once_handles_every_site():
    edited = ATTENTION.replace("self.scaling = config.head_dim**-0.5", "self.scaling = config.query_scale")
    assert _step(ATTENTION, edited, "attention.kernel") == []


def test_a_loader_change_reaches_every_site_reading_the_parameter():
    edited = ATTENTION.replace(
        "fused_qkv_weight_loader(q_size=4)", "permuted(fused_qkv_weight_loader(q_size=4))"
    )
    assert _step(ATTENTION, edited, "attention.qkv") == []


def test_an_edit_in_the_caller_reaches_the_callee_parameters():
    edited = ATTENTION.replace(
        "        return self.forward_prefill(",
        "        position_embeddings = identity(position_embeddings)\n        return self.forward_prefill(",
    )
    left = _step(ATTENTION, edited, "rope.application")
    assert {s.function for s in left} == {"forward_decode"}  # only the prefill call site got it


def test_a_replaced_kernel_counts_as_edited():
    edited = ATTENTION.replace("NF.segmented_attention_cp(", "_segmented_attention_cp_unfused(")
    left = _step(ATTENTION, edited, "attention.kernel")
    assert "NF.segmented_attention_cp" not in {s.kind for s in left}


def test_a_norm_weight_fused_into_a_kernel_is_its_own_site():
    source = textwrap.dedent(
        """
        class LlamaDecoderLayer(nn.Module):
            def __init__(self, config):
                self.input_layernorm = LlamaRMSNorm(config)
                self.self_attn = LlamaAttention(config)

            def forward(self, x):
                if self.fp8:
                    return self.self_attn(x, ln_w=self.input_layernorm.weight)
                return self.self_attn(self.input_layernorm(x))
        """
    )
    swapped = source.replace(
        "self.input_layernorm = LlamaRMSNorm(config)", "self.input_layernorm = LlamaLayerNorm(config)"
    )
    left = _step(source, swapped, "norm.application")
    assert [s.kind for s in left] == ["self.self_attn(self.input_layernorm.weight)"]
