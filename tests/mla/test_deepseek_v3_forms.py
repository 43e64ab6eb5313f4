"""The deepseek_v3 reference on the forms of the family its config reads at
run time: no query LoRA (``q_lora_rank`` None, as DeepSeek-V2-Lite), rotate-half
RoPE (``rope_interleave`` False), routing without group limits (``n_group`` 1),
and YaRN with ``mscale`` / ``mscale_all_dim`` (the scale DeepSeek-V3 ships).
Each a tiny checkpoint of its own, validated at TP=1 fp32 (slow: each builds
and runs transformers)."""

from __future__ import annotations

import pytest

from autoport_cst.validate import build_tiny_checkpoint, validate_model

from .conftest import MLA_DIMENSIONS, REFERENCE

FORMS = {
    "no-query-lora": {"q_lora_rank": None},
    "rotate-half": {"rope_interleave": False},
    "no-groups": {"n_group": 1, "topk_group": 1},
    "yarn-mscale": {
        "rope_parameters": {
            "rope_type": "yarn",
            "rope_theta": 10000.0,
            "factor": 4.0,
            "original_max_position_embeddings": 128,
            "mscale": 0.707,
            "mscale_all_dim": 1.0,
        }
    },
}


def _source_config(directory, values):
    from transformers import DeepseekV3Config

    dimensions = {k: v for k, v in MLA_DIMENSIONS.items() if k not in values}
    config = DeepseekV3Config(**{**dimensions, **values})
    config.architectures = ["DeepseekV3ForCausalLM"]
    config.save_pretrained(directory)
    return directory / "config.json", {k: v for k, v in dimensions.items() if k != "q_lora_rank"}


@pytest.mark.slow
@pytest.mark.parametrize("form", sorted(FORMS))
def test_form_validates(form, tmp_path):
    source, dimensions = _source_config(tmp_path / "source", FORMS[form])
    checkpoint = tmp_path / "tiny"
    build_tiny_checkpoint(source, checkpoint, seed=0, dimensions=dimensions)
    report = validate_model(REFERENCE, checkpoint, steps=8, config_variants=False, parallel_layouts=False)
    assert report.equivalent, f"{report.first_diverging} {report.failure} {report.failed_checks}"
