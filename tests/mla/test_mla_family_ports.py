"""The multi-latent attention family ports from the deepseek_v3 reference
end to end (`autoport-cst port` on a tiny checkpoint: research, plan, apply,
validation at TP=1 fp32 and bf16 with the declared variants and parallel
layouts, TP=2 fp32, config variants and guards): DeepSeek-V3 with no
codemod; DeepSeek-V2 (softmax scores, no selection bias, no
renormalization, a plain top-k), DeepSeek-V2-Lite (no query LoRA) and
DeepSeek-V2 with group_limited_greedy by codemods; GLM-4-MoE-Lite (dense
layers per mlp_layer_types, no group limit) and Sarvam-MLA (DeepSeek-V3
without query LoRA, no modeling file of its own) with group-limit. Dense MLA
(Youtu, MiniCPM3): tests/mla/test_dense_mla.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

pytest.importorskip("transformers")

from autoport_cst.cli import cli  # noqa: E402


def _checkpoint(tmp_path: Path, architecture: str, **values) -> Path:
    from autoport_cst.validate import build_tiny_checkpoint

    directory = tmp_path / "source"
    build_tiny_checkpoint(architecture, directory, seed=0)
    if values:
        path = directory / "config.json"
        config = json.loads(path.read_text())
        config.update(values)
        path.write_text(json.dumps(config, indent=2))
    return directory


def _port(tmp_path: Path, source: Path) -> tuple[int, dict, str]:
    outcome = tmp_path / "outcome.json"
    result = CliRunner().invoke(
        cli, ["port", str(source), "--out", str(tmp_path / "out"), "--tp", "2", "--json", str(outcome)]
    )
    data = json.loads(outcome.read_text()) if outcome.is_file() else {}
    return result.exit_code, data, result.output


@pytest.mark.slow
@pytest.mark.parametrize(
    ("architecture", "values", "codemods"),
    [
        ("DeepseekV3ForCausalLM", {}, set()),
        (
            "DeepseekV2ForCausalLM",
            {},
            {"group-limit", "no-routing-bias", "norm-topk-prob", "router-activation"},
        ),
        ("DeepseekV2ForCausalLM", {"q_lora_rank": None}, {"group-limit", "no-routing-bias"}),
        (
            "DeepseekV2ForCausalLM",
            {"topk_method": "group_limited_greedy", "n_group": 2, "topk_group": 1},
            {"group-limit", "no-routing-bias"},
        ),
        ("Glm4MoeLiteForCausalLM", {}, {"group-limit"}),
        ("sarvam_mla", {}, {"group-limit"}),
    ],
    ids=[
        "deepseek_v3",
        "deepseek_v2",
        "deepseek_v2_lite",
        "deepseek_v2_group_limited",
        "glm4_moe_lite",
        "sarvam_mla",
    ],
)
def test_the_family_ports_and_validates(tmp_path, architecture, values, codemods):
    code, data, output = _port(tmp_path, _checkpoint(tmp_path, architecture, **values))
    assert code == 0, output
    assert data.get("reference") == "deepseek_v3", data
    steps = set(data.get("steps") or ())
    assert codemods <= steps, (codemods, steps)
