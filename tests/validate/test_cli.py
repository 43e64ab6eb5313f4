"""``autoport-cst tiny`` and ``autoport-cst validate``: exit codes, messages
and the JSON report; torch stays out of the CLI's import."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
from click.testing import CliRunner

from autoport_cst.cli.validate_cmd import tiny_command, validate_command
from autoport_cst.validate import REPORT_SCHEMA

ROOT = Path(__file__).resolve().parents[2]


def test_cli_import_does_not_load_torch() -> None:
    code = (
        "import sys; import autoport_cst, autoport_cst.cli, autoport_cst.cli.validate_cmd, autoport_cst.validate; "
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    )
    env = {"PYTHONPATH": str(ROOT / "src")}
    output = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert output.stdout.strip() == "[]"


def test_tiny_then_validate_exit_0_with_json(tmp_path: Path, llama3_dir: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(tiny_command, ["llama", str(tmp_path / "ckpt"), "--seed", "5"])
    assert result.exit_code == 0, result.output
    assert "LlamaForCausalLM" in result.output
    report_path = tmp_path / "report.json"
    result = runner.invoke(
        validate_command,
        [str(llama3_dir), "--hf", str(tmp_path / "ckpt"), "--steps", "3", "--json", str(report_path)],
    )
    assert result.exit_code == 0, result.output
    assert "EQUIVALENT" in result.output and "NOT EQUIVALENT" not in result.output
    data = json.loads(report_path.read_text())
    jsonschema.validate(data, REPORT_SCHEMA)
    assert data["equivalent"] is True and data["settings"]["steps"] == 3


def test_validate_exit_1_names_the_component(broken_port, tiny_llama: Path) -> None:
    port = broken_port(
        "            hidden_states = self.mlp(hidden_states, is_prefill=True)\n        return residual + hidden_states",
        "            hidden_states = self.mlp(hidden_states, is_prefill=True)\n        return hidden_states",
    )
    result = CliRunner().invoke(
        validate_command, [str(port), "--hf", str(tiny_llama), "--dtype", "bf16", "--steps", "2"]
    )
    assert result.exit_code == 1, result.output
    assert "NOT EQUIVALENT" in result.output and "layers.0.output" in result.output


def test_validate_exit_2_on_bad_input(tmp_path: Path, llama3_dir: Path, tiny_llama: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(validate_command, [str(tmp_path / "missing"), "--hf", str(tiny_llama)])
    assert result.exit_code == 2
    assert "no such model package directory" in result.output
    result = runner.invoke(validate_command, [str(llama3_dir), "--hf", str(tiny_llama), "--steps", "0"])
    assert result.exit_code == 2
    result = runner.invoke(tiny_command, ["NotAnArchitecture", str(tmp_path / "x")])
    assert result.exit_code == 2 and "NotAnArchitecture" in result.output


def test_decode_tokens_is_checked_and_reaches_the_report(
    tmp_path: Path, llama3_dir: Path, tiny_llama: Path
) -> None:
    import pytest

    from autoport_cst.errors import InputError
    from autoport_cst.validate import validate_model

    runner = CliRunner()
    base = [str(llama3_dir), "--hf", str(tiny_llama), "--steps", "3"]
    for value, message in (
        ("0", "--decode-tokens must be a positive integer (1: one new token per decode step), got 0"),
        ("-2", "--decode-tokens must be a positive integer"),
        ("4", "--decode-tokens 4 exceeds --steps 3"),
        ("two", "'two' is not a valid integer"),
    ):
        result = runner.invoke(validate_command, [*base, "--decode-tokens", value])
        assert result.exit_code == 2 and message in result.output, (value, result.output)
    with pytest.raises(InputError, match="--decode-tokens must be a positive integer"):
        validate_model(llama3_dir, tiny_llama, steps=3, decode_tokens=0)
    report_path = tmp_path / "report.json"
    result = runner.invoke(validate_command, [*base, "--decode-tokens", "2", "--json", str(report_path)])
    assert result.exit_code == 0, result.output
    data = json.loads(report_path.read_text())
    jsonschema.validate(data, REPORT_SCHEMA)
    assert data["settings"]["decode_tokens"] == 2
    assert data["parallel_layouts"] == []  # the layouts follow a plain run of one token per step
