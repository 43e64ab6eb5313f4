"""Decoder layers under other names than ``model.layers[i].self_attn`` /
``.mlp`` are found by what they compute (a module list the backbone runs,
each block holding an attention and a feed-forward), and what research then
does not understand is named as that computation, not as layers not found."""

from __future__ import annotations

import pytest

from autoport_cst.errors import UnrealizableDiffError
from autoport_cst.port import port

# tiny model -> (the module list of its layers, features its refusal must name,
#                words the evidence of one of them must hold); no features: it ports
# (GPT-2's learned positions, gpt_bigcode-style multi-query, Falcon's attention written out and OPT's
# feed-forward in the layer are realized: tests/coverage_dense)
BLOCKS = {
    "gpt2": ("GPT2Model.h", set(), ""),
    "opt": ("OPTDecoder.layers", set(), ""),  # fc1/fc2 in the layer are read as an MLP
    "falcon": ("FalconModel.h", set(), ""),
    # the residual its attention and MLP add themselves is the block's (tests/research/test_residual_in_sublayer.py)
    # ... its embedding LayerNorm is a norm like its layers' (tests/research/test_embedding_norm.py)
    # ... and its ALiBi bias is read (tests/research/test_alibi_research.py)
    "bloom": ("BloomModel.h", set(), ""),
    "mpt": ("MptModel.blocks", set(), ""),
    "biogpt": ("BioGptModel.layers", set(), ""),  # its feed-forward in the layer is read as an MLP
    # its attention one module down (attn.attention) writes out its scores and softmax (read: it ports)
    "gpt_neo": ("GPTNeoModel.h", set(), ""),
}


@pytest.mark.parametrize("name", sorted(BLOCKS))
def test_the_layers_are_found_by_what_they_compute(tiny, name):
    module_list, _, _ = BLOCKS[name]
    found = tiny.research(name)
    layers = found.finding("num_layers", "code")
    assert layers is not None and layers.value == 2 and layers.evidence.startswith(module_list + ":"), layers
    assert not any(e.startswith("code.decoder_layers") for e in found.spec.unsupported or ())


@pytest.mark.parametrize("name", sorted(n for n, (_, features, _) in BLOCKS.items() if features))
def test_the_refusal_names_the_computation(tiny, name, tmp_path):
    _, features, words = BLOCKS[name]
    with pytest.raises(UnrealizableDiffError) as refused:
        port(str(tiny.directory(name)), f"refused_{name}", tmp_path / "out")
    assert set(refused.value.features) == features, refused.value.features
    assert "code.decoder_layers" not in str(refused.value)
    assert words in str(refused.value), str(refused.value)
    assert not (tmp_path / "out" / "vllm_neuron").exists()


def test_falcon_rotates_on_the_path_its_layer_takes(tiny):
    """Falcon's attention rotates q/k only when no ALiBi tensor is passed:
    the rotation is read on the path the backbone's arguments select."""
    spec = tiny.research("falcon").spec
    assert spec.rope.style == "rotate_half" and spec.rope.partial_rotary_factor == 1.0
    assert not any(e.startswith("rope.") for e in spec.unsupported or ())


def test_a_linear_subclass_with_its_own_forward_is_a_projection(tiny):
    """Falcon's FalconLinear (input @ weight.T + bias) is read as a linear
    layer: its attention and MLP are found with their projections."""
    code = tiny.research("falcon")
    keys = code.checkpoint_keys
    assert any(k.endswith("self_attention.query_key_value.weight") for k in keys)
    assert code.spec.checkpoint.key_map.get("mlp.up_proj") == "mlp.dense_h_to_4h"
