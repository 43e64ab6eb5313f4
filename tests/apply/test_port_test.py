"""The logit test every port gets: named after the port, so the tests of
several ports collect side by side, and rerunning what the port was
validated on (the record beside it), not the architecture's default config."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from autoport_cst.apply.port_test import port_test_source
from autoport_cst.cli import cli
from autoport_cst.validation_record import (
    load_runs,
    port_test_dir_of,
    port_test_path,
    record_beside,
    run_record,
    save_runs,
)

ROOT = Path(__file__).resolve().parents[2]


def apply(plan: str, out: Path) -> None:
    result = CliRunner().invoke(
        cli, ["apply", "--plan", str(ROOT / "examples" / plan), "--out", str(out), "-q"]
    )
    assert result.exit_code == 0, result.output


def tiny(source, directory: Path, seed: int, **dimensions) -> Path:
    from autoport_cst.validate import build_tiny_checkpoint

    return build_tiny_checkpoint(source, directory, seed=seed, dimensions=dimensions or None).directory


def pytest_in(out: Path, *args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args, "test"],
        cwd=out,
        capture_output=True,
        text=True,
        timeout=600,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    return output


def test_the_tests_of_two_ports_collect_side_by_side(tmp_path):
    for name, architecture in (("qwen2", "Qwen2ForCausalLM"), ("mistral", "MistralForCausalLM")):
        path = tmp_path / port_test_path(name)
        path.parent.mkdir(parents=True)
        path.write_text(port_test_source(name, architecture))
    output = pytest_in(tmp_path, "--collect-only", "-q")
    assert "test_qwen2_logits.py::test_logits_match_transformers[nothing-recorded]" in output
    assert "test_mistral_logits.py::test_logits_match_transformers[nothing-recorded]" in output


@pytest.mark.slow
def test_each_port_test_reruns_what_was_recorded_for_it(tmp_path):
    out = tmp_path / "out"
    apply("qwen2.plan.json", out)
    apply("mistral.plan.json", out)
    # qwen2 validated on a config that is not the architecture's default
    # (one KV head), and once on a checkpoint directory that is gone since
    checkpoint = tiny("Qwen2ForCausalLM", tmp_path / "tiny", seed=1, num_key_value_heads=1)
    runs = [
        run_record(checkpoint, tp=1, dtype="fp32", steps=2, seed=0, weights_seed=1),
        run_record(checkpoint, tp=1, dtype="bf16", steps=2, seed=0, label="was-there"),
    ]
    runs[1]["checkpoint_dir"] = str(tmp_path / "gone")
    save_runs(out / "test/vllm_neuron/model/qwen2", runs, merge=False)
    output = pytest_in(out, "-v", "-rs")
    assert "test_qwen2_logits.py::test_logits_match_transformers[tp1-fp32] PASSED" in output
    assert "test_qwen2_logits.py::test_logits_match_transformers[was-there] SKIPPED" in output
    assert "is not there" in output
    assert "test_mistral_logits.py::test_logits_match_transformers[nothing-recorded] SKIPPED" in output
    assert "no validation recorded" in output


def test_a_recorded_tiny_checkpoint_is_rebuilt_tensor_for_tensor(tmp_path):
    import torch

    from autoport_cst.validate.recorded import CheckpointCache

    base = tiny("LlamaForCausalLM", tmp_path / "base", seed=0)
    config = json.loads((base / "config.json").read_text())
    config["rms_norm_eps"] = 1e-3  # a field the default config has otherwise
    (tmp_path / "varied").mkdir()
    (tmp_path / "varied" / "config.json").write_text(json.dumps(config))
    dims = {k: config[k] for k in ("hidden_size", "num_attention_heads", "num_key_value_heads")}
    validated = tiny(tmp_path / "varied" / "config.json", tmp_path / "validated", seed=7, **dims)
    run = run_record(validated, tp=1, dtype="fp32", steps=2, seed=0, weights_seed=7)
    assert run["config"]["rms_norm_eps"] == 1e-3
    rebuilt = CheckpointCache(tmp_path / "cache").get(run)
    assert json.loads((rebuilt / "config.json").read_text()) == run["config"]
    original, again = tensors(validated), tensors(rebuilt)
    assert original.keys() == again.keys() and all(torch.equal(original[k], again[k]) for k in original)


def test_a_tiny_checkpoint_in_the_saved_key_format_is_rebuilt_in_it(tmp_path):
    from autoport_cst.validate import build_tiny_checkpoint
    from autoport_cst.validate.recorded import CheckpointCache
    from autoport_cst.validate.tiny import KEY_FORMAT
    from autoport_cst.validation_record import KEY_FORMAT as RECORDED_KEY_FORMAT

    assert RECORDED_KEY_FORMAT == KEY_FORMAT
    saved = build_tiny_checkpoint(
        "GPTNeoXForCausalLM", tmp_path / "saved", seed=2, key_format="saved"
    ).directory
    run = run_record(saved, tp=1, dtype="fp32", steps=2, seed=0, weights_seed=2)
    assert run["key_format"] == "saved"
    rebuilt = CheckpointCache(tmp_path / "cache").get(run)
    assert tensors(rebuilt).keys() == tensors(saved).keys()


def tensors(checkpoint: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(checkpoint / "model.safetensors"))


def test_validate_records_only_beside_a_port_test(tmp_path):
    apply("qwen2.plan.json", tmp_path)
    written = (tmp_path / port_test_path("qwen2")).read_text()
    assert written == port_test_source("qwen2", "Qwen2ForCausalLM")
    package = tmp_path / "vllm_neuron/model/qwen2"
    assert port_test_dir_of(package) == (tmp_path / port_test_path("qwen2")).parent
    assert port_test_dir_of(ROOT / "reference_models" / "llama3") is None
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text('{"architectures": ["Qwen2ForCausalLM"]}')
    run = dict(tp=2, ep=1, dtype="bf16", steps=4, seed=3, prefill="auto", dcp=1, attention_dp=2)
    record_beside(package, checkpoint, **run)
    record_beside(package, checkpoint, **run)  # the same run replaces its record
    [recorded] = load_runs(port_test_dir_of(package))
    assert recorded["label"] == "tp2-bf16-attention_dp=2"
    assert recorded["options"] == {"attention_dp": 2}
    assert recorded["checkpoint_dir"] == str(checkpoint.resolve())
    assert record_beside(ROOT / "reference_models" / "llama3", checkpoint, **run) is None


@pytest.mark.parametrize("name", ["qwen2", "gemma2"])
def test_the_port_test_is_named_after_the_port(name):
    assert port_test_path(name) == f"test/vllm_neuron/model/{name}/test_{name}_logits.py"
