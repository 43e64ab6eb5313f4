"""Llama 4's mixture of experts ports from qwen3_moe: a tiny Llama 4 text
model with its attention features off (no QK norm, no temperature, RoPE on
every layer, full attention) keeps a dense layer (0) and an MoE layer (1:
a shared expert beside four routed ones, sigmoid top-2 weights used as
computed, experts fused ``[E, H, 2I]`` that read the router-weighted
hidden state). Its config has no ``norm_topk_prob``, so the plan fixes the
no-renormalization in code (``norm-topk-prob``) instead of leaving the
qwen3_moe config default (renormalize) to apply. Copies of the port that
scale after the experts (POST_SCALE) or renormalize fail at the MoE layer.

Slow: a port and five validations of about half a minute of CPU each.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("transformers")

pytestmark = pytest.mark.slow

PRE_SCALE = "expert_affinities_scaling_mode=ExpertAffinityScaleMode.PRE_SCALE,"
POST_SCALE = "expert_affinities_scaling_mode=ExpertAffinityScaleMode.POST_SCALE,"
NOT_RENORMALIZED = "self.norm_topk_prob = False\n"
RENORMALIZED = "self.norm_topk_prob = True\n"


@pytest.fixture(scope="module")
def llama4_moe(tmp_path_factory):
    import transformers

    from autoport_cst.port import port
    from autoport_cst.validate import build_tiny_checkpoint

    values = transformers.Llama4TextConfig(
        use_qk_norm=False, attn_temperature_tuning=False, no_rope_layers=[1] * 48, attention_chunk_size=None
    ).to_dict()
    values["architectures"] = ["Llama4ForCausalLM"]
    config_dir = tmp_path_factory.mktemp("llama4-moe-config")
    (config_dir / "config.json").write_text(json.dumps(values), encoding="utf-8")
    source = tmp_path_factory.mktemp("src-llama4-moe")
    build_tiny_checkpoint(config_dir / "config.json", source, seed=0)
    out = tmp_path_factory.mktemp("out-llama4-moe")
    return source, port(str(source), "cov_llama4_moe", out, tp=1, steps=8, force=True)


def test_the_tiny_checkpoint_has_a_dense_and_an_moe_layer(llama4_moe):
    source, _ = llama4_moe
    config = json.loads((source / "config.json").read_text(encoding="utf-8"))
    assert config["num_hidden_layers"] == 2 and config["moe_layers"] == [1]
    assert config["intermediate_size_mlp"] == 128 and "norm_topk_prob" not in config


def test_llama4_moe_ports_and_validates(llama4_moe):
    _, result = llama4_moe
    assert result.reference == "qwen3_moe"
    assert {"dense-layers", "expert-input-scaling", "norm-topk-prob", "shared-experts"} <= set(result.steps)
    model = (Path(result.package_dir) / "model.py").read_text(encoding="utf-8")
    assert NOT_RENORMALIZED in model and PRE_SCALE in model
    runs = {run.dtype: run for run in result.runs if run.tp == 1}
    assert runs["fp32"].equivalent, runs["fp32"].summary
    assert runs["bf16"].equivalent, runs["bf16"].summary


def test_llama4_moe_validates_at_tp2(llama4_moe):
    from autoport_cst.validate.api import validate_model

    source, result = llama4_moe
    report = validate_model(Path(result.package_dir), source, dtype="fp32", steps=4, tp=2)
    assert report.equivalent, report.summary()


@pytest.mark.parametrize(
    "before, after",
    [(PRE_SCALE, POST_SCALE), (NOT_RENORMALIZED, RENORMALIZED)],
    ids=["post-scale", "renormalized"],
)
def test_a_copy_that_weighs_the_experts_otherwise_fails_at_the_moe_layer(llama4_moe, tmp_path, before, after):
    from autoport_cst.validate.api import validate_model

    source, result = llama4_moe
    package = tmp_path / Path(result.package_dir).name
    shutil.copytree(result.package_dir, package)
    model = package / "model.py"
    text = model.read_text(encoding="utf-8")
    assert before in text
    model.write_text(text.replace(before, after), encoding="utf-8")
    report = validate_model(package, source, dtype="fp32", steps=4)
    assert not report.equivalent
    assert report.first_diverging is not None and "layers.1.mlp" in report.first_diverging.component
