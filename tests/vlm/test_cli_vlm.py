"""``autoport-cst validate`` on a vision-language checkpoint runs validate_vlm:
exit 0 and the JSON report for the qwen3_vl reference, exit 2 for an option
the vision-language validation does not take or a TP size the text decoder's
rules refuse (before anything runs)."""

from __future__ import annotations

import json

from click.testing import CliRunner

from autoport_cst.cli.validate_cmd import validate_command

from .conftest import REFERENCE


def test_reference_validates_and_writes_the_report(tiny_qwen3_vl, tmp_path):
    report_path = tmp_path / "report.json"
    result = CliRunner().invoke(
        validate_command,
        [str(REFERENCE), "--hf", str(tiny_qwen3_vl), "--steps", "1", "--json", str(report_path)],
    )
    assert result.exit_code == 0, result.output
    assert "equivalent" in result.output and "vision.merger" in result.output
    report = json.loads(report_path.read_text())
    assert report["equivalent"] and report["first_diverging"] is None
    assert {check["prompt"] for check in report["checks"]} == {"image", "text"}


def test_options_of_the_text_validator_are_refused(tiny_qwen3_vl):
    result = CliRunner().invoke(
        validate_command, [str(REFERENCE), "--hf", str(tiny_qwen3_vl), "--mlp-dp", "2"]
    )
    assert result.exit_code == 2
    assert "--mlp-dp: not supported for a vision-language checkpoint" in result.output


def test_tp_refused_by_the_text_decoder_rules(tiny_qwen3_vl):
    result = CliRunner().invoke(validate_command, [str(REFERENCE), "--hf", str(tiny_qwen3_vl), "--tp", "3"])
    assert result.exit_code == 2
    assert "4 attention heads not divisible by 3" in result.output


def test_tiny_builds_a_vision_language_checkpoint_that_validates(tmp_path):
    from autoport_cst.cli.validate_cmd import tiny_command

    checkpoint = tmp_path / "tiny"
    built = CliRunner().invoke(tiny_command, ["Qwen2_5_VLForConditionalGeneration", str(checkpoint)])
    assert built.exit_code == 0, built.output
    config = json.loads((checkpoint / "config.json").read_text())
    assert config["architectures"] == ["Qwen2_5_VLForConditionalGeneration"]
    assert config["vision_config"]["fullatt_block_indexes"] == [1]
    refused = CliRunner().invoke(
        tiny_command, ["Qwen3VLForConditionalGeneration", str(tmp_path / "b"), "--set", "depth=2"]
    )
    assert refused.exit_code == 2 and "--set: not supported" in refused.output
