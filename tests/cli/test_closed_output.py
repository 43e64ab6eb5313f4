"""Output whose reader went away (`autoport-cst lint ... | head -1` once
head has its line) exits 141 without a word, as `cat` killed by SIGPIPE
does: never 1, which says the result is written and wrong (issue 18, item
4). The reader here is gone before the command writes (a pipe whose read
end is closed), which is what `| head -1` leaves behind, every time."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import LLAMA_CONFIG, ROOT, write_safetensors

QWEN3 = ROOT / "reference_models" / "qwen3"
GUARD = "validate_fp8_segmented_supported(self.k_cache.dtype in _FP8_DTYPES, fp8_packed=False)"
VIOLATING = """
import torch
from torch import nn


class Rotary(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim))
"""


def run_into_closed_pipe(*args, cwd: Path) -> subprocess.CompletedProcess:
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(
            [sys.executable, "-m", "autoport_cst", *map(str, args)],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            cwd=cwd,
            env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
            timeout=300,
        )
    finally:
        os.close(write_end)


def test_lint_into_a_closed_pipe_exits_141_quietly(tmp_path):
    (tmp_path / "model.py").write_text(VIOLATING)
    findings = run_into_closed_pipe("lint", "--no-cache", "model.py", cwd=tmp_path)
    assert (findings.returncode, findings.stderr) == (141, "")  # was 1: "violations remain"
    rules = run_into_closed_pipe("lint", "--list-rules", cwd=tmp_path)
    assert (rules.returncode, rules.stderr) == (141, "")  # was 1
    usage = run_into_closed_pipe("--help", cwd=tmp_path)
    assert (usage.returncode, usage.stderr) == (141, "")


def _llama_checkpoint(directory: Path) -> Path:
    """LLAMA_CONFIG's checkpoint with every tensor (zeros): research reads
    the headers only."""
    directory.mkdir()
    (directory / "config.json").write_text(__import__("json").dumps(LLAMA_CONFIG))
    hidden, inner, vocab = 64, 128, 512
    tensors = {"model.embed_tokens.weight": [vocab, hidden], "model.norm.weight": [hidden]}
    for layer in range(LLAMA_CONFIG["num_hidden_layers"]):
        prefix = f"model.layers.{layer}."
        tensors |= {
            prefix + "input_layernorm.weight": [hidden],
            prefix + "post_attention_layernorm.weight": [hidden],
            prefix + "self_attn.q_proj.weight": [hidden, hidden],
            prefix + "self_attn.k_proj.weight": [32, hidden],
            prefix + "self_attn.v_proj.weight": [32, hidden],
            prefix + "self_attn.o_proj.weight": [hidden, hidden],
            prefix + "mlp.gate_proj.weight": [inner, hidden],
            prefix + "mlp.up_proj.weight": [inner, hidden],
            prefix + "mlp.down_proj.weight": [hidden, inner],
        }
    tensors["lm_head.weight"] = [vocab, hidden]
    write_safetensors(directory / "model.safetensors", tensors)
    return directory


def test_plan_into_a_closed_pipe_exits_141_quietly_and_writes_nothing(tmp_path):
    checkpoint = _llama_checkpoint(tmp_path / "llama")
    result = run_into_closed_pipe("plan", checkpoint, "--name", "x", "-o", "x.plan.json", cwd=tmp_path)
    assert (result.returncode, result.stderr) == (141, "")  # was 1 (rich's SystemExit(1))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["llama"]  # no plan, no temporary file


@pytest.fixture
def unguarded(tmp_path: Path) -> Path:
    """The qwen3 reference without its FP8 segmented-prefill guard: validate
    reports it (NRN009, exit 1) without running anything."""
    port = tmp_path / "qwen3"
    shutil.copytree(QWEN3, port, ignore=shutil.ignore_patterns("__pycache__"))
    model = port / "model.py"
    text = model.read_text(encoding="utf-8")
    assert text.count(GUARD) == 1
    model.write_text(text.replace(GUARD, "pass"), encoding="utf-8")
    return port


def test_validate_report_into_a_closed_pipe_exits_141_quietly(unguarded, fake_llama, tmp_path):
    result = run_into_closed_pipe("validate", unguarded, "--hf", fake_llama, cwd=tmp_path)
    assert (result.returncode, result.stderr) == (141, "")  # was 1, as for a port that does not validate
    shown = subprocess.run(
        [sys.executable, "-m", "autoport_cst", "validate", unguarded, "--hf", fake_llama],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        timeout=300,
    )
    assert shown.returncode == 1 and "DOES NOT VALIDATE" in shown.stdout  # what the pipe did not take
