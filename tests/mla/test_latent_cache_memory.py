"""The latent cache really holds latents: a port of the deepseek_v3 reference
that asks for a full K/V cache (every head's keys and values) fails the
validator's memory assertion at the ``kv_cache`` stage, before anything runs;
the reference's own spec (one latent row per token, on every TP rank) passes."""

from __future__ import annotations

import shutil
from types import SimpleNamespace

import pytest
import torch

from autoport_cst.validate import validate_model
from autoport_cst.validate.driver import PortFailure, PortSession
from autoport_cst.validate.latent_cache import oversized_latent_layers, values_per_token
from autoport_cst.validate.package import imported_package
from autoport_cst.validate.scenario import PagedLayout, Scenario
from autoport_cst.validate.standin import standin_installed
from autoport_cst.validate.standin.kv_cache import KVSpec, LayerSpec

from .conftest import MLA_DIMENSIONS, REFERENCE

LATENT_SPEC = """                num_kv_heads=1,
                head_size=layer.self_attn.latent_width,
                dtype=layer.self_attn.dtype,
                sliding_window_size=None,
                chunk_size=None,
                latent_kv=True,"""
FULL_KV_SPEC = """                num_kv_heads=layer.self_attn.num_heads_per_rank,
                head_size=layer.self_attn.qk_head_dim,
                dtype=layer.self_attn.dtype,
                sliding_window_size=None,
                chunk_size=None,
                latent_kv=False,"""

CONFIG = SimpleNamespace(kv_lora_rank=32, qk_rope_head_dim=8)


def _spec(**layer) -> KVSpec:
    return KVSpec(layers=[LayerSpec(name="layers.0.self_attn", dtype=None, **layer)])


def test_a_latent_row_fits_and_full_kv_does_not():
    assert oversized_latent_layers(_spec(num_kv_heads=1, head_size=40, latent_kv=True), CONFIG) is None
    full = _spec(num_kv_heads=4, head_size=24)
    assert values_per_token(full.layers[0]) == 2 * 4 * 24
    message = oversized_latent_layers(full, CONFIG)
    assert "4 head(s) x 24 = 192 values" in message and "= 40" in message
    # the latent row stored as a key/value pair is twice the row
    assert oversized_latent_layers(_spec(num_kv_heads=1, head_size=40), CONFIG) is not None


def test_models_without_latent_attention_are_not_checked():
    full = _spec(num_kv_heads=4, head_size=24)
    assert oversized_latent_layers(full, SimpleNamespace(num_attention_heads=4)) is None
    assert oversized_latent_layers(full, SimpleNamespace(kv_lora_rank=None)) is None


def _full_kv_port(tmp_path):
    port = tmp_path / "deepseek_v3"
    shutil.copytree(REFERENCE, port)
    model = port / "model.py"
    source = model.read_text()
    assert source.count(LATENT_SPEC) == 1
    model.write_text(source.replace(LATENT_SPEC, FULL_KV_SPEC))
    return port


def _session(port, tmp_path):
    """The engine's set-up of ``port`` up to its KV cache (no checkpoint is read before)."""
    from transformers import DeepseekV3Config

    sizes = dict(hidden_size=64, num_attention_heads=4, num_hidden_layers=4, n_routed_experts=4)
    hf_config = DeepseekV3Config(**MLA_DIMENSIONS, **sizes, intermediate_size=128, moe_intermediate_size=64)
    hf_config.dtype = torch.float32
    with standin_installed(), imported_package(port) as package:
        scenario = Scenario(prompts=((1, 2),), steps=1, layout=PagedLayout.plan(1, 4, 4, seed=0))
        return PortSession(package.factory, tmp_path / "unread", hf_config, scenario)


def test_the_engine_set_up_refuses_a_full_kv_cache_for_a_latent_model(tmp_path):
    with pytest.raises(PortFailure) as failure:
        _session(_full_kv_port(tmp_path), tmp_path)
    assert failure.value.stage == "kv_cache"
    assert "hold more than the latent row per token" in failure.value.message
    assert "4 head(s) x 24 = 192 values" in failure.value.message


@pytest.mark.slow
def test_a_port_caching_full_kv_does_not_validate(tiny_deepseek_v3, tmp_path):
    report = validate_model(
        _full_kv_port(tmp_path), tiny_deepseek_v3, steps=2, config_variants=False, parallel_layouts=False
    )
    assert not report.equivalent
    assert "kv_cache" in str(report.failure)
    assert "hold more than the latent row per token" in str(report.failure)
