"""A norm on the token embeddings before the first layer that computes what
the decoder layers' norms do is ``embedding.norm`` (BLOOM's
``word_embeddings_layernorm``, NanoChat's shared weightless ``norm``), its
tensors' checkpoint module ``model.embed_norm`` when it has any; the
embedding's scale is read through it."""

from __future__ import annotations

import pytest


def test_bloom_norms_its_embeddings_as_its_layers(tiny):
    found = tiny.research("bloom")
    spec = found.spec
    assert spec.embedding.norm is True
    assert spec.embedding.scale == "none" and spec.embedding.multiplier is None
    assert spec.checkpoint.key_map["model.embed_norm"] == "transformer.word_embeddings_layernorm"
    assert "word_embeddings_layernorm (LayerNorm)" in found.decision("embedding.norm").evidence
    assert not any(e.startswith("embedding_norm") for e in spec.unsupported or ())
    assert not {"embedding.scale", "embedding.multiplier"} & set(found.unknown)


def test_transformers_norms_bloom_embeddings_like_its_layers(tiny):
    """What research reads, measured: the first layer's input is
    word_embeddings_layernorm(word_embeddings(ids)), a LayerNorm of the layers'
    epsilon with a bias."""
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny.directory("bloom"), dtype=torch.float32).eval()
    backbone = model.transformer
    norm, layer_norm = backbone.word_embeddings_layernorm, backbone.h[0].input_layernorm
    assert type(norm) is type(layer_norm) is torch.nn.LayerNorm
    assert norm.eps == layer_norm.eps and norm.bias is not None
    seen = []
    handle = backbone.h[0].register_forward_pre_hook(
        lambda module, args, kwargs: seen.append(args[0]), with_kwargs=True
    )
    ids = torch.tensor([[1, 5, 9, 2]])
    with torch.no_grad():
        model(input_ids=ids)
        expected = norm(backbone.word_embeddings(ids))
    handle.remove()
    torch.testing.assert_close(seen[0], expected)


def test_a_weightless_embedding_norm_maps_no_tensor(tiny):
    spec = tiny.research("nanochat").spec
    assert spec.embedding.norm is True and spec.norm.affine is False
    assert "model.embed_norm" not in (spec.checkpoint.key_map or {})
