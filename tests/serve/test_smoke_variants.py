"""Real vLLM serves ports beyond the float32 full-attention default (slow:
each starts vLLM's engine, about a minute or more on a loaded 2-core
machine; ``--run-slow``):

- a **sliding-window** port (Mistral, window 6, shorter than the prompts)
  equals transformers, its layers held by vLLM's KV-cache manager as
  sliding-window specs, with prefix caching too; GPT-OSS mixes sliding and
  full layers (two KV-cache groups) in the per-reference smoke test;
- **bf16**: the offline run's raw logits pass validate's bf16 logit gates,
  and a wrong decode path fails them;
- **FP8 KV cache**: a Qwen3 port on a checkpoint with distinct per-layer
  ``k_scale``/``v_scale`` equals validate's FP8 baseline token for token,
  and the same port with its scales swapped does not.

The cheap halves (the specs reported, the checks' logic, bad input) run by
default in test_kv_cache_specs.py, test_bf16_checks.py, test_limits.py and
test_smoke_input.py.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from autoport_cst.cli import cli
from autoport_cst.serve.smoke import run_smoke

from .test_smoke_battery import NO_SERVE, _failed, _port

ROOT = Path(__file__).resolve().parents[2]
SCALES = {0: (0.06, 0.011), 1: (0.12, 0.022)}  # per layer (k_scale, v_scale): distinct

pytestmark = [pytest.mark.slow, pytest.mark.skipif(bool(NO_SERVE), reason=NO_SERVE)]


def _example_port(plan: str, tmp: Path) -> tuple[Path, Path]:
    from autoport_cst.validate import build_tiny_checkpoint

    out = tmp / "out"
    result = CliRunner().invoke(
        cli, ["apply", "--plan", str(ROOT / "examples" / plan), "--out", str(out), "-q"]
    )
    assert result.exit_code == 0, result.output
    architecture = json.loads((ROOT / "examples" / plan).read_text())["architecture"]
    build_tiny_checkpoint(architecture, tmp / "tiny", seed=0)
    return out, tmp / "tiny"


def test_a_sliding_window_port_serves_equal_to_transformers(tmp_path):
    out, checkpoint = _example_port("mistral.plan.json", tmp_path)
    window = json.loads((checkpoint / "config.json").read_text())["sliding_window"]
    outcome = run_smoke(out, checkpoint, runs=["offline", "server-prefix-caching"], workdir=tmp_path / "logs")
    assert outcome.failure is None, outcome.failure
    assert outcome.passed, _failed(outcome)
    (kinds,) = [check for check in outcome.checks if "KV-cache manager" in check["name"]]
    assert kinds["detail"] == f"2 sliding-window layer(s) (window [{window}]), 0 full-attention layer(s)"
    assert outcome.figures["server-prefix-caching"]["prefix_cache_hits"] > 0


def test_bf16_offline_run_passes_validates_bf16_logit_gates(tmp_path):
    out, checkpoint = _port("llama3", tmp_path)
    outcome = run_smoke(out, checkpoint, dtype="bf16", workdir=tmp_path / "logs")
    assert outcome.runs == ["offline"]
    assert outcome.failure is None, outcome.failure
    assert outcome.passed, _failed(outcome)
    gates = [check["name"].rsplit(" ", 1)[-1] for check in outcome.checks if "bf16 logits" in check["name"]]
    assert gates == ["logit_validation", "three_way", "cosine", "top1_agreement", "greedy_match"]


def test_bf16_a_wrong_decode_path_fails_the_logit_gates(tmp_path):
    out, checkpoint = _port("llama3", tmp_path)
    model = out / "vllm_neuron" / "model" / "llama3" / "model.py"
    text = model.read_text()
    right = "softmax_scale=self.scaling / self.k_scale_float,"
    assert text.count(right) == 1  # the decode kernel's call only
    model.write_text(text.replace(right, "softmax_scale=0.5 * self.scaling / self.k_scale_float,"))
    outcome = run_smoke(out, checkpoint, dtype="bf16", workdir=tmp_path / "logs")
    assert outcome.failure is None, outcome.failure
    failed = _failed(outcome)
    assert failed and all("bf16 logits" in name for name in failed), failed
    assert any("three_way" in name for name in failed), failed


def _with_scales(checkpoint: Path) -> Path:
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    path = checkpoint / "model.safetensors"
    with safe_open(str(path), framework="pt") as handle:
        metadata = handle.metadata()
    state = load_file(str(path))
    for layer, (k, v) in SCALES.items():
        state[f"model.layers.{layer}.self_attn.k_scale"] = torch.tensor([k])
        state[f"model.layers.{layer}.self_attn.v_scale"] = torch.tensor([v])
    save_file(state, str(path), metadata=metadata)
    return checkpoint


def test_fp8_kv_cache_equals_validates_fp8_baseline(tmp_path):
    out, checkpoint = _port("qwen3", tmp_path)
    outcome = run_smoke(out, _with_scales(checkpoint), kv_cache_dtype="fp8", workdir=tmp_path / "logs")
    assert outcome.failure is None, outcome.failure
    assert outcome.passed, _failed(outcome)
    names = [check["name"] for check in outcome.checks]
    assert (
        "every layer's KV cache is torch.float8_e4m3fn (vLLM's spec and the cache bound to the port)" in names
    )
    assert sum("against the FP8 baseline" in name for name in names) == 6


def test_fp8_swapped_kv_scales_fail(tmp_path):
    out, checkpoint = _port("qwen3", tmp_path)
    model = out / "vllm_neuron" / "model" / "qwen3" / "model.py"
    text = model.read_text()
    anchor = "            k_scale=self.k_scale,\n            v_scale=self.v_scale,\n"
    assert text.count(anchor) == 1
    model.write_text(
        text.replace(anchor, "            k_scale=self.v_scale,\n            v_scale=self.k_scale,\n")
    )
    shutil.rmtree(out / "vllm_neuron" / "model" / "qwen3" / "__pycache__", ignore_errors=True)
    outcome = run_smoke(out, _with_scales(checkpoint), kv_cache_dtype="fp8", workdir=tmp_path / "logs")
    assert outcome.failure is None, outcome.failure
    failed = _failed(outcome)
    assert failed and all("against the FP8 baseline" in name for name in failed), failed
