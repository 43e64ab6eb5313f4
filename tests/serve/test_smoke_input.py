"""``autoport-cst smoke`` on bad input: exit 2 with a clear message before
anything starts; the plugin is inert unless asked for; vLLM stays out of
every import but the serving modules'."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from autoport_cst.cli.smoke_cmd import smoke_command
from autoport_cst.serve import plugin
from autoport_cst.serve.smoke import SERVE_PYTHON_VARIABLE

ROOT = Path(__file__).resolve().parents[2]
CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "vocab_size": 512,
}
REGISTRY = """from .llama import LlamaForCausalLM


def get_models():
    return [("LlamaForCausalLM", LlamaForCausalLM)]
"""


@pytest.fixture
def port_tree(tmp_path: Path) -> Path:
    registry = tmp_path / "out" / "vllm_neuron" / "model" / "registry.py"
    registry.parent.mkdir(parents=True)
    registry.write_text(REGISTRY)
    return tmp_path / "out"


def _checkpoint(directory: Path, **changes) -> Path:
    import torch
    from safetensors.torch import save_file

    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps({**CONFIG, **changes}))
    save_file({"x": torch.zeros(2)}, str(directory / "model.safetensors"))
    return directory


def _smoke(*args: str, env: dict | None = None):
    return CliRunner().invoke(smoke_command, list(args), env=env)


def test_architecture_differing_in_case_is_bad_input(port_tree, tmp_path):
    checkpoint = _checkpoint(tmp_path / "ckpt", architectures=["LLaMAForCausalLM"])
    result = _smoke(str(port_tree), "--hf", str(checkpoint))
    assert result.exit_code == 2
    assert (
        "the registry has 'LlamaForCausalLM' but config.json's architectures[0] is 'LLaMAForCausalLM'"
        in result.output
    )
    assert "case included" in result.output


def test_a_port_not_in_the_registry_is_bad_input(port_tree, tmp_path):
    checkpoint = _checkpoint(tmp_path / "ckpt", architectures=["MistralForCausalLM"])
    result = _smoke(str(port_tree), "--hf", str(checkpoint))
    assert result.exit_code == 2
    assert "no entry for 'MistralForCausalLM'" in result.output


def test_paths_tp_and_runs_are_checked(port_tree, tmp_path):
    checkpoint = _checkpoint(tmp_path / "ckpt")
    assert "no vllm_neuron/model/registry.py" in _smoke(str(tmp_path), "--hf", str(checkpoint)).output
    assert "no such checkpoint directory" in _smoke(str(port_tree), "--hf", str(tmp_path / "no")).output
    result = _smoke(str(port_tree), "--hf", str(checkpoint), "--tp", "3")
    assert result.exit_code == 2 and "--tp 3" in result.output
    result = _smoke(str(port_tree), "--hf", str(checkpoint), "--runs", "offline,warp")
    assert result.exit_code == 2 and "--runs: warp" in result.output


def test_no_serve_environment_is_bad_input(port_tree, tmp_path):
    checkpoint = _checkpoint(tmp_path / "ckpt")
    result = _smoke(
        str(port_tree), "--hf", str(checkpoint), env={SERVE_PYTHON_VARIABLE: str(tmp_path / "python")}
    )
    assert result.exit_code == 2
    assert f"{SERVE_PYTHON_VARIABLE}=" in result.output and "no such file" in result.output


def test_plugin_is_inert_unless_asked_for(monkeypatch):
    monkeypatch.delenv(plugin.ACTIVATION_VARIABLE, raising=False)
    assert plugin.platform_plugin() is None
    plugin.register_architectures()  # nothing to register, nothing imported
    monkeypatch.setenv(plugin.ACTIVATION_VARIABLE, "1")
    assert plugin.platform_plugin() == "autoport_cst.serve.platform.StandinPlatform"


def test_vllm_is_imported_only_by_the_serving_modules():
    code = (
        "import sys; import autoport_cst.cli, autoport_cst.cli.smoke_cmd, autoport_cst.serve.smoke, "
        "autoport_cst.serve.plugin, autoport_cst.validate; print([m for m in sys.modules if m.split('.')[0] == 'vllm'])"
    )
    output = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(ROOT / "src")},
    )
    assert output.stdout.strip() == "[]"


def test_port_serve_without_a_serve_environment_stops_before_anything(tmp_path):
    from autoport_cst.cli.port_cmd import port_command

    checkpoint = _checkpoint(tmp_path / "ckpt")
    result = CliRunner().invoke(
        port_command,
        [str(checkpoint), "--name", "tiny_llama", "--out", str(tmp_path / "out"), "--serve"],
        env={SERVE_PYTHON_VARIABLE: str(tmp_path / "python")},
    )
    assert result.exit_code == 2, result.output
    assert "no such file" in result.output
    assert not (tmp_path / "out").exists()


def test_bf16_and_fp8_serve_the_offline_run_only(port_tree, tmp_path):
    checkpoint = _checkpoint(tmp_path / "ckpt")
    result = _smoke(str(port_tree), "--hf", str(checkpoint), "--dtype", "bf16", "--runs", "offline,server")
    assert result.exit_code == 2 and "--dtype bf16 serves the offline run only" in result.output
    result = _smoke(str(port_tree), "--hf", str(checkpoint), "--kv-cache-dtype", "fp8", "--runs", "server")
    assert result.exit_code == 2 and "--kv-cache-dtype fp8 serves the offline run in fp32" in result.output
    result = _smoke(str(port_tree), "--hf", str(checkpoint), "--kv-cache-dtype", "fp8", "--dtype", "bf16")
    assert result.exit_code == 2 and "--kv-cache-dtype fp8 serves the offline run in fp32" in result.output
    result = _smoke(str(port_tree), "--hf", str(checkpoint), "--kv-cache-dtype", "fp8_e5m2")
    assert result.exit_code == 2 and "--kv-cache-dtype must be one of auto, fp8" in result.output
    result = _smoke(str(port_tree), "--hf", str(checkpoint), "--dtype", "fp16")
    assert result.exit_code == 2 and "--dtype must be one of fp32, bf16" in result.output
