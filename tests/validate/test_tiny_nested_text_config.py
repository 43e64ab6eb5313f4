"""Tiny checkpoints of models whose text model has a config of its own
(``text_config``): Fuyu (a Persimmon text model) and the Gemma 4 assistant
(a Gemma 4 text model run on another model's states). ``tiny`` shrank only
the top level, which has no size field of the text model: 9.4 G and 2.9 G
parameters, refused. The nested text config is now shrunk as any config
(its layer count chosen so that every per-layer variant is built), and the
top level's widths of a hidden state (``backbone_hidden_size``) follow the
text model's, so that ``plan`` and ``port`` can be tried on them."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    from autoport_cst.validate.tiny import build_tiny_checkpoint

    root = tmp_path_factory.mktemp("nested-text")
    return {
        name: build_tiny_checkpoint(name, root / name, seed=0)
        for name in ("fuyu", "gemma4_unified_assistant")
    }


def test_fuyu_builds_and_computes(built):
    import transformers

    tiny = built["fuyu"]
    text = json.loads((tiny.directory / "config.json").read_text())["text_config"]
    assert text["hidden_size"] == 64 and text["num_hidden_layers"] == 2
    model = transformers.AutoModelForCausalLM.from_pretrained(str(tiny.directory))
    assert sum(p.numel() for p in model.parameters()) == tiny.num_parameters
    logits = model(input_ids=torch.tensor([[1, 2, 3, 4]])).logits
    assert logits.shape[-1] == text["vocab_size"] and torch.isfinite(logits).all()


def test_the_assistant_keeps_its_full_attention_layer_and_its_shared_kv(built):
    import transformers

    tiny = built["gemma4_unified_assistant"]
    values = json.loads((tiny.directory / "config.json").read_text())
    text = values["text_config"]
    assert values["backbone_hidden_size"] == text["hidden_size"]
    # every layer reads the keys and values of the target model: still every layer
    assert text["num_kv_shared_layers"] == text["num_hidden_layers"]
    model = transformers.AutoModelForCausalLM.from_pretrained(str(tiny.directory))
    attentions = [layer.self_attn for layer in model.model.layers]
    head_dims = {a.head_dim for a in attentions}
    assert len(head_dims) == 2, "the full-attention layer's own head size must be built"
    assert "full_attention" in text["layer_types"]
    assert sum(p.numel() for p in model.parameters()) <= 5_000_000


def test_plan_refuses_them_by_named_features(built):
    from autoport_cst.port import refusal
    from autoport_cst.research import choose_reference, research

    named = {}
    for name, tiny in built.items():
        found = research(str(tiny.directory))
        error = refusal(found, choose_reference(found.spec, name, found.architecture, None))
        assert error is not None and "could not classify" not in str(error)
        named[name] = set(error.features)
    assert named["fuyu"] == {"modules_beside_decoder"}  # its image-patch embedding
    assert {"external_inputs", "proportional_rope", "attention_sizes_per_layer"} <= named[
        "gemma4_unified_assistant"
    ]
