"""Tiny configs of the models the shrinker broke: a heterogeneous config
(Gemma 4's per-layer head_dim), per-layer width lists and per-layer-input
embedding sizes (Gemma 3n), a count of KV-sharing layers larger than the
tiny depth (Gemma 3n), and a size the config class derives at init from a
placeholder (Bamba's and Granite-MoE-Hybrid's ``mamba_d_head = "auto"``).
Each failed before: an internal error (Gemma 4), or an InputError asking
for a small config.json."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

BROKEN_BEFORE = ["Gemma3nForCausalLM", "Gemma4ForCausalLM", "BambaForCausalLM", "GraniteMoeHybridForCausalLM"]


def _tiny(source: str, dimensions: dict | None = None):
    from autoport_cst.validate.tiny import _check_parameter_count, _tiny_config

    config, architecture, model_class = _tiny_config(source, dimensions)
    _check_parameter_count(model_class, config, architecture)  # transformers builds it (meta device)
    return config


@pytest.mark.parametrize("architecture", BROKEN_BEFORE)
def test_the_shrunk_config_validates_and_builds(architecture):
    from autoport_cst.validate.tiny import config_values

    config = _tiny(architecture)
    reloaded = type(config).from_dict(config_values(config))  # config.json loads back
    assert reloaded.hidden_size == 64


def test_per_layer_overrides_keep_their_ratio_on_the_kept_layers():
    """Gemma 4's full-attention layers have head_dim 512 beside 256: 32
    beside the tiny 16, on the full-attention layers the tiny model keeps."""
    config = _tiny("Gemma4ForCausalLM")
    layers = config.per_layer_config
    full = [i for i, kind in enumerate(config.layer_types) if kind == "full_attention"]
    assert full and len(layers) == config.num_hidden_layers
    assert {layers[i].head_dim for i in full} == {32}
    assert {layers[i].head_dim for i in range(len(layers)) if i not in full} == {16}


def test_per_layer_widths_and_per_layer_input_sizes_shrink():
    config = _tiny("Gemma3nForCausalLM")
    assert config.intermediate_size == [128] * config.num_hidden_layers
    assert config.vocab_size_per_layer_input == config.vocab_size == 511
    assert config.hidden_size_per_layer_input == 64


@pytest.mark.parametrize(("layers", "shared"), [(2, 1), (10, 4)])
def test_a_layer_count_covering_the_tiny_depth_keeps_its_share(layers, shared):
    """Gemma 3n: the last 15 of 35 layers read the keys and values of
    earlier ones; at a depth of 10, 4 do (at 2, 1), so that both kinds of
    layer are built."""
    config = _tiny("Gemma3nForCausalLM", {"num_hidden_layers": layers})
    assert config.num_kv_shared_layers == shared


def test_the_layer_count_s_alias_is_not_a_count_to_share():
    """GPT-Neo names its layer count num_layers (attribute_map)."""
    config = _tiny("GPTNeoForCausalLM")
    assert config.num_layers == config.num_hidden_layers


@pytest.mark.parametrize("architecture", ["BambaForCausalLM", "GraniteMoeHybridForCausalLM"])
def test_a_size_derived_from_a_placeholder_is_derived_again(architecture):
    config = _tiny(architecture)
    assert config.mamba_d_head * config.mamba_n_heads == config.mamba_expand * config.hidden_size


def test_tiny_builds_a_bamba_that_transformers_runs(tmp_path: Path):
    """The command, end to end: exit 0, and transformers loads the
    checkpoint and computes finite logits on CPU (its default config has
    Mamba layers only; without a cache: transformers' own cache needs an
    attention layer)."""
    from transformers import AutoModelForCausalLM

    out = tmp_path / "bamba"
    run = subprocess.run(
        [sys.executable, "-m", "autoport_cst", "tiny", "BambaForCausalLM", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert run.returncode == 0, run.stderr
    assert json.loads((out / "config.json").read_text())["mamba_d_head"] == 1
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    ids = torch.arange(2, 14).unsqueeze(0)
    with torch.no_grad():
        logits = model(ids, use_cache=False).logits
    assert logits.shape == (1, 12, 511) and bool(torch.isfinite(logits).all())
