"""`autoport-cst plan`: the plan it writes, what it prints, --review, --ref,
and bad input (exit 2, a positioned message, nothing written)."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest
from click.testing import CliRunner

from autoport_cst.cli import cli
from autoport_cst.plan import load_plan


def run(*args, input=None):
    return CliRunner().invoke(cli, [str(a) for a in args], input=input)


def test_plan_qwen2(tiny, tmp_path):
    out = tmp_path / "plan.json"
    result = run("plan", tiny.directory("qwen2"), "--name", "my_qwen2", "-o", out)
    assert result.exit_code == 0, result.output
    plan = load_plan(out)
    assert plan.name == "my_qwen2"
    assert plan.class_prefix == "MyQwen2"
    assert plan.architecture == "Qwen2ForCausalLM"
    assert plan.reference == "llama3"
    assert plan.spec.attention.qkv_bias is True
    data = json.loads(out.read_text())
    assert data["version"] == 1 and data["spec"]["attention"]["qkv_bias"] is True
    text = result.output
    for heading in ("section", "reference", "target", "change needed", "pitfalls", "recommendation"):
        assert heading in text
    assert "codemod add-qkv-bias" in text
    assert "TP 2" in text


def test_plan_is_consumed_by_apply(tiny, tmp_path):
    out = tmp_path / "plan.json"
    assert run("plan", tiny.directory("qwen2"), "--name", "qwen2x", "-o", out).exit_code == 0
    result = run("apply", "--plan", out, "--out", tmp_path / "port")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "port" / "vllm_neuron" / "model" / "qwen2x" / "model.py").is_file()


def test_moe_plan_picks_the_moe_reference(tiny, tmp_path):
    from autoport_cst.apply.reference import builtin_names

    if "qwen3_moe" not in builtin_names():
        pytest.skip("no built-in MoE reference")
    out = tmp_path / "plan.json"
    result = run("plan", tiny.directory("qwen3_moe"), "--name", "q3moe", "-o", out)
    assert result.exit_code == 0, result.output
    assert load_plan(out).reference == "qwen3_moe"


def test_ref_option_reports_blocking_fields(tiny, tmp_path):
    """Written but not portable: exit 1, the blocking features listed."""
    out = tmp_path / "plan.json"
    result = run("plan", tiny.directory("gpt_oss"), "--name", "oss", "-o", out, "--ref", "llama3")
    assert result.exit_code == 1, result.output
    not_portable = next(line for line in result.output.splitlines() if line.startswith("not portable:"))
    assert "[mlp.glu]" in not_portable and "[moe]" in not_portable
    assert "llama3: blocked by mlp.glu, moe" in result.output
    plan = load_plan(out)
    assert plan.reference == "llama3"
    assert "mlp.glu" in plan.description  # the blocking fields are recorded in the plan


def test_an_edited_plan_is_measured_as_written(tiny, tmp_path):
    """--review with an edited plan: its exit code is that plan's, here one
    with a computation no reference realizes (spec.unsupported)."""
    edited = tmp_path / "edited.json"
    assert run("plan", tiny.directory("llama"), "--name", "l", "-o", edited).exit_code == 0
    data = json.loads(edited.read_text())
    data["spec"]["unsupported"] = ["code.mixer: a token mixer of its own"]
    edited.write_text(json.dumps(data))
    out = tmp_path / "plan.json"
    result = run("plan", tiny.directory("llama"), "--name", "l", "-o", out, "--review", input=f"{edited}\n")
    assert result.exit_code == 1, result.output
    assert "not portable" in result.output and "unsupported" in result.output
    assert load_plan(out).spec.unsupported


def test_review_declined_writes_nothing(tiny, tmp_path):
    out = tmp_path / "plan.json"
    result = run("plan", tiny.directory("llama"), "--name", "l", "-o", out, "--review", input="n\n")
    assert result.exit_code == 0
    assert "not written" in result.output
    assert not out.exists()


def test_review_accepted(tiny, tmp_path):
    out = tmp_path / "plan.json"
    result = run("plan", tiny.directory("llama"), "--name", "l", "-o", out, "--review", input="y\n")
    assert result.exit_code == 0, result.output
    assert load_plan(out).name == "l"


def test_review_with_an_edited_plan(tiny, tmp_path):
    edited = tmp_path / "edited.json"
    assert run("plan", tiny.directory("llama"), "--name", "l", "-o", edited).exit_code == 0
    data = json.loads(edited.read_text())
    data["name"] = "edited_name"
    edited.write_text(json.dumps(data))
    out = tmp_path / "plan.json"
    result = run("plan", tiny.directory("llama"), "--name", "l", "-o", out, "--review", input=f"{edited}\n")
    assert result.exit_code == 0, result.output
    assert load_plan(out).name == "edited_name"


def test_review_with_an_invalid_edited_plan_writes_nothing(tiny, tmp_path):
    edited = tmp_path / "edited.json"
    edited.write_text('{"version": 1,')
    out = tmp_path / "plan.json"
    result = run("plan", tiny.directory("llama"), "--name", "l", "-o", out, "--review", input=f"{edited}\n")
    assert result.exit_code == 2
    assert "malformed JSON" in result.output
    assert not out.exists()


# ---- bad input -------------------------------------------------------------------


def bad(tmp_path: Path, config: str | None, weights: bytes | None = None) -> Path:
    directory = tmp_path / "model"
    directory.mkdir()
    if config is not None:
        (directory / "config.json").write_text(config)
    if weights is not None:
        (directory / "model.safetensors").write_bytes(weights)
    return directory


@pytest.mark.parametrize(
    "config, weights, message",
    [
        (None, None, "no config.json"),
        ('{"model_type": "llama",\n  "hidden_size": }', None, "config.json:2:18: malformed JSON"),
        ("[1, 2]", None, "must hold a JSON object"),
        ('{"hidden_size": 64}', None, "at $.model_type: no model_type"),
        ('{"model_type": "no_such_model"}', None, "at $.model_type: model_type 'no_such_model' is not known"),
    ],
)
def test_bad_config(tmp_path, config, weights, message):
    directory = bad(tmp_path, config, weights)
    out = tmp_path / "plan.json"
    result = run("plan", directory, "--name", "x", "-o", out)
    assert result.exit_code == 2
    assert message in result.output
    assert not out.exists()


def test_unreadable_safetensors_header(tiny, tmp_path):
    directory = tmp_path / "model"
    directory.mkdir()
    shutil.copy(tiny.directory("llama") / "config.json", directory)
    (directory / "model.safetensors").write_bytes(struct.pack("<Q", 10**12) + b"{}")
    out = tmp_path / "plan.json"
    out.write_text("previous")
    result = run("plan", directory, "--name", "x", "-o", out)
    assert result.exit_code == 2
    assert "model.safetensors: unreadable safetensors header" in result.output
    assert out.read_text() == "previous"  # nothing written


def test_no_modeling_source(tiny, tmp_path, monkeypatch):
    empty = tmp_path / "transformers"
    (empty / "models").mkdir(parents=True)
    monkeypatch.setattr("autoport_cst.research.sources.transformers_root", lambda: empty)
    out = tmp_path / "plan.json"
    result = run("plan", tiny.directory("llama"), "--name", "x", "-o", out)
    assert result.exit_code == 2
    assert "config.json at $.model_type: model_type 'llama': no modeling source found" in result.output
    assert not out.exists()


@pytest.mark.parametrize(
    "args, message",
    [
        (["/no/such/dir", "--name", "x"], "no such directory"),
        (["DIR", "--name", "Not-Snake"], "is not snake_case"),
    ],
)
def test_bad_arguments(tiny, tmp_path, args, message):
    args = [str(tiny.directory("llama")) if a == "DIR" else a for a in args]
    out = tmp_path / "plan.json"
    result = run("plan", *args, "-o", out)
    assert result.exit_code == 2
    assert message in result.output
    assert not out.exists()


def test_unknown_reference(tiny, tmp_path):
    out = tmp_path / "plan.json"
    result = run("plan", tiny.directory("llama"), "--name", "x", "-o", out, "--ref", "nope")
    assert result.exit_code == 2
    assert "unknown reference 'nope'" in result.output
    assert not out.exists()
