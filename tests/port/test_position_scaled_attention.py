"""Attention temperature (position-scaled-attention): Ministral 3 scales its
rotated queries by 1 + beta * log(1 + floor(position / n)). The tiny
checkpoint makes n smaller than the prompts, so the factor changes inside
them; a port validates with it, and fails with it taken out of either path."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("transformers")


def test_the_tiny_config_makes_the_temperature_change_inside_the_prompts():
    import transformers

    from autoport_cst.validate.tiny import TINY_TEMPERATURE_FLOOR, shrink_config

    ministral = shrink_config(transformers.Ministral3Config(), "Ministral3ForCausalLM")
    assert ministral.rope_parameters["original_max_position_embeddings"] == TINY_TEMPERATURE_FLOOR
    llama4 = shrink_config(transformers.Llama4TextConfig(), "Llama4ForCausalLM")
    assert llama4.floor_scale == TINY_TEMPERATURE_FLOOR
    # a RoPE without the temperature keeps its original context
    yarn = transformers.Qwen2Config(
        rope_parameters={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096}
    )
    assert shrink_config(yarn, "Qwen2ForCausalLM").rope_parameters["original_max_position_embeddings"] == 4096


def test_a_rope_type_variant_keeps_the_temperature_entries():
    from autoport_cst.validate.config_variants import _edits

    rope = {"rope_type": "yarn", "rope_theta": 1e6, "factor": 16.0}
    base = {"head_dim": 16, "hidden_size": 64, "num_attention_heads": 4}
    temperature = {"llama_4_scaling_beta": 0.1, "original_max_position_embeddings": 5}
    (edit,) = _edits("rope.type", "default", {**base, "rope_parameters": {**rope, **temperature}})
    assert edit[1]["rope_parameters"] == {"rope_type": "default", "rope_theta": 1e6, **temperature}
    (plain,) = _edits("rope.type", "default", {**base, "rope_parameters": rope})
    assert plain[1]["rope_parameters"] == {"rope_type": "default", "rope_theta": 1e6}


@pytest.fixture(scope="module")
def ministral3_port(tmp_path_factory):
    from autoport_cst.port import port
    from autoport_cst.validate.tiny import build_tiny_checkpoint

    root = tmp_path_factory.mktemp("ministral3")
    build_tiny_checkpoint("Ministral3ForCausalLM", root / "ckpt", seed=0)
    outcome = port(str(root / "ckpt"), "ministral3", root / "out")
    return outcome


@pytest.mark.slow
def test_ministral3_ports_with_its_temperature_and_validates(ministral3_port):
    assert ministral3_port.validated, [r.summary for r in ministral3_port.runs]
    text = (ministral3_port.package_dir / "model.py").read_text()
    assert "q_scale=_query_temperature(positions" in text  # the decode path
    assert "q = _with_temperature(q, _query_temperature(positions" in text  # the prefill path


@pytest.mark.slow
@pytest.mark.parametrize(
    "path, pattern, replacement",
    [
        ("prefill", r"q = _with_temperature\(q, [^\n]*\n", "pass\n"),
        ("decode", r"q_scale=_query_temperature\([^\n]*\)(?=[,)\n])", "q_scale=None"),
    ],
)
def test_a_port_without_the_temperature_on_one_path_does_not_validate(
    ministral3_port, tmp_path, path, pattern, replacement
):
    import shutil

    from autoport_cst.validate import validate_model

    package = tmp_path / "ministral3"
    shutil.copytree(ministral3_port.package_dir, package)
    model = package / "model.py"
    text, count = re.subn(pattern, replacement, model.read_text())
    assert count >= 1
    model.write_text(text)
    report = validate_model(str(package), str(ministral3_port.checkpoint_dir))
    assert not report.equivalent, path
