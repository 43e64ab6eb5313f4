"""Refusals name what the model computes, not spec fields research could
not classify (issue 17 item 4, issue 15: plans say nothing false).

Measured on transformers' own modules, then on research of the tiny (or
config-only) checkpoint:

- Gemma 4's attention scale is the constant 1.0 its code writes
  (``self.scaling = 1.0``): no config field gives it, and none has to;
  ``attention.scale_key`` was left unclassified.
- its full-attention layers' ``proportional`` RoPE rotates the first
  quarter of the frequency pairs of each head at the whole head's
  frequencies and leaves the others unrotated: ``rope.type`` had "no spec
  value", now ``proportional_rope`` is named;
- its full-attention layers have heads twice as wide as the sliding ones
  (per_layer_config): the spec's head_dim is layer 0's, so
  ``attention_sizes_per_layer`` is named (the plan stated one head size);
- Dots3's latent attention normalises its rotary key
  (``k_rope_only_layernorm``, which research took for the latent's norm)
  and builds its latent norms with ``rms_norm_eps``: named
  ``rotary_key_norm`` and ``latent_norm_epsilon``, not
  ``attention.latent_norm_eps``.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def gemma4(tmp_path_factory):
    from autoport_cst.validate.tiny import build_tiny_checkpoint

    directory = tmp_path_factory.mktemp("gemma4") / "gemma4_text"
    build_tiny_checkpoint("gemma4_text", directory, seed=0)
    return directory


@pytest.fixture(scope="module")
def gemma4_research(gemma4):
    from autoport_cst.research import research

    return research(str(gemma4))


@pytest.fixture(scope="module")
def gemma4_model(gemma4):
    import transformers

    return transformers.AutoModelForCausalLM.from_pretrained(str(gemma4))


def _unsupported(result) -> dict[str, str]:
    return {entry.partition(":")[0]: entry.partition(":")[2] for entry in result.spec.unsupported or ()}


def test_gemma4_scale_is_a_constant_of_its_code(gemma4, gemma4_research):
    from transformers import AutoConfig
    from transformers.models.gemma4.modeling_gemma4 import Gemma4TextAttention

    values = json.loads((gemma4 / "config.json").read_text())
    for head_dim in (16, 32):  # the scale does not follow the head size, nor any other field
        config = AutoConfig.for_model(**{**values, "head_dim": head_dim})
        assert Gemma4TextAttention(config, 0).scaling == 1.0
    spec = gemma4_research.spec.attention
    assert spec.scale == 1.0 and spec.scale_key is None
    assert "attention.scale_key" not in gemma4_research.unknown
    assert "a constant" in gemma4_research.decision("attention.scale_key").evidence


def test_gemma4_proportional_rope_is_named_from_its_frequencies(gemma4_model, gemma4_research):
    rotary = gemma4_model.model.rotary_emb
    inv_freq = rotary.full_attention_inv_freq
    rotated = int((inv_freq != 0).sum())
    pairs = inv_freq.numel()
    head = 2 * pairs
    theta = gemma4_model.config.rope_parameters["full_attention"]["rope_theta"]
    expected = theta ** (-torch.arange(0, 2 * rotated, 2, dtype=torch.float64) / head)
    assert torch.allclose(inv_freq[:rotated].double(), expected, rtol=1e-5)
    assert 0 < rotated < pairs and not inv_freq[rotated:].any()
    named = _unsupported(gemma4_research)
    assert "proportional_rope" in named and "rope.type" not in named
    assert f"the first {rotated} of the {pairs} frequency pairs" in named["proportional_rope"]
    assert f"base ** (-2i / {head})" in named["proportional_rope"]


def test_gemma4_head_sizes_per_layer_are_named(gemma4_model, gemma4_research):
    layers = gemma4_model.model.layers
    widths = {layer.self_attn.q_proj.out_features for layer in layers}
    head_dims = {layer.self_attn.head_dim for layer in layers}
    assert len(widths) == 2 and len(head_dims) == 2  # transformers builds two head sizes
    assert gemma4_research.spec.attention.head_dim == layers[0].self_attn.head_dim
    named = _unsupported(gemma4_research)
    assert "attention_sizes_per_layer" in named
    full = [i for i, layer in enumerate(layers) if layer.self_attn.head_dim != layers[0].self_attn.head_dim]
    shown = named["attention_sizes_per_layer"]
    assert (
        f"head_dim {min(head_dims)} on layers 0-" in shown
        and f"{max(head_dims)} on layers {full[0]}," in shown
    )


def test_gemma4_refusal_names_no_unclassified_field(gemma4_research):
    from autoport_cst.port import refusal
    from autoport_cst.research import choose_reference

    found = gemma4_research
    error = refusal(found, choose_reference(found.spec, "gemma4_text", found.architecture, None))
    assert error is not None
    assert "could not classify" not in str(error)
    assert {"proportional_rope", "attention_sizes_per_layer"} <= set(error.features)
    assert not {"attention.scale_key", "rope.type"} & set(error.features)


@pytest.fixture(scope="module")
def dots3(tmp_path_factory):
    """Dots3's transformers default config, alone (no tiny checkpoint builds)."""
    from autoport_cst.validate.tiny import resolve_config, write_config_json

    directory = tmp_path_factory.mktemp("dots3")
    config, _ = resolve_config("Dots3NoteForCausalLM")
    config.architectures = ["Dots3NoteForCausalLM"]
    write_config_json(config, directory / "config.json")
    return directory


def test_dots3_rotary_key_norm_and_latent_epsilon_are_named(dots3):
    from transformers import AutoConfig
    from transformers.models.dots3_note.modeling_dots3_note import Dots3NoteTextAttention

    from autoport_cst.research import research

    config = AutoConfig.from_pretrained(str(dots3)).get_text_config()
    config.num_hidden_layers, config.hidden_size = 1, 256
    attention = Dots3NoteTextAttention(config, 0)
    key_norm = attention.k_rope_only_layernorm
    assert key_norm.weight.numel() == config.qk_rope_head_dim  # a norm as wide as the rotary key
    assert attention.kv_a_layernorm.variance_epsilon == config.rms_norm_eps != 1e-6
    named = _unsupported(research(str(dots3)))
    assert "k_rope_only_layernorm normalises the rotary key" in named["rotary_key_norm"]
    assert "kv_a_layernorm uses epsilon config.rms_norm_eps" in named["latent_norm_epsilon"]
    assert "attention.latent_norm_eps" not in named


def test_inkling_scale_of_one_over_head_dim_is_named(tmp_path):
    """Inkling's attention scales its scores by 1 / head_dim (its q/k are
    RMS-normalised per head), computed from the layer's head size: no config
    field gives it and no scale form describes it (attention.scale_key was
    listed as unclassified)."""
    from transformers import AutoConfig
    from transformers.models.inkling.modeling_inkling import InklingAttention

    from autoport_cst.research import research
    from autoport_cst.validate.tiny import build_tiny_checkpoint

    tiny = build_tiny_checkpoint("inkling_text", tmp_path / "inkling", seed=0)
    values = json.loads((tiny.directory / "config.json").read_text())
    full = next(i for i, kind in enumerate(values["layer_types"]) if kind != "hybrid_sliding")
    for head_dim in (16, 32):
        config = AutoConfig.for_model(**{**values, "head_dim": head_dim})
        assert InklingAttention(config, full).scaling == 1 / head_dim
    found = research(str(tiny.directory))
    named = _unsupported(found)
    assert "inverse_head_dim_scale" in named and "attention.scale_key" not in named
    assert "= 1 / head_dim (" in named["inverse_head_dim_scale"]


def test_gemma3n_widths_per_layer_are_named(tmp_path):
    """Gemma 3n's config gives intermediate_size one width per layer (a
    list): the refusal said 'an MLP width the code builds other than the
    config's: the code builds 128 where the config says [128, 128, ...]',
    which is not so; it names the list a port cannot read as one value."""
    import transformers

    from autoport_cst.port import refusal
    from autoport_cst.research import choose_reference, research
    from autoport_cst.validate.tiny import build_tiny_checkpoint

    tiny = build_tiny_checkpoint("gemma3n_text", tmp_path / "gemma3n", seed=0)
    widths = json.loads((tiny.directory / "config.json").read_text())["intermediate_size"]
    model = transformers.AutoModelForCausalLM.from_pretrained(str(tiny.directory))
    assert [layer.mlp.up_proj.out_features for layer in model.model.layers] == widths
    found = research(str(tiny.directory))
    error = refusal(found, choose_reference(found.spec, "gemma3n_text", found.architecture, None))
    assert error is not None and "per_layer_sizes" in error.features
    assert "mlp.intermediate_size" not in error.features and "the code builds" not in str(error)
    assert f"one value per layer ({len(widths)} entries" in str(error)
