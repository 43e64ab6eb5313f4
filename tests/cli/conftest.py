"""Fixtures of the command-line tests: checkpoints written by hand (a
config.json and a safetensors file of zeros, no torch needed) for the input
checks, a tiny random one (torch) for the runs, and a runner of the console
entry point in a subprocess, where the exit code and the imports are the
real ones."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LLAMA3 = ROOT / "reference_models" / "llama3"

# A Llama the way `tiny` shrinks one: 4 heads, 2 KV heads, TP 1 and 2 valid.
LLAMA_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 2,
    "vocab_size": 512,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
}


def write_safetensors(path: Path, tensors: dict[str, list[int]]) -> int:
    """A safetensors file of F32 zeros with these shapes; returns its size."""
    header, offset = {}, 0
    for name, shape in tensors.items():
        size = 4
        for dim in shape:
            size *= dim
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * offset)
    return path.stat().st_size


@pytest.fixture
def fake_llama(tmp_path: Path) -> Path:
    """A checkpoint directory whose config and headers read (its tensors are
    zeros, and only two of them)."""
    directory = tmp_path / "llama"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(LLAMA_CONFIG), encoding="utf-8")
    write_safetensors(
        directory / "model.safetensors",
        {"model.embed_tokens.weight": [512, 64], "lm_head.weight": [512, 64]},
    )
    return directory


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from autoport_cst.validate.tiny import build_tiny_checkpoint

    directory = tmp_path_factory.mktemp("tiny-llama")
    build_tiny_checkpoint("LlamaForCausalLM", directory, seed=0)
    return directory


# Runs the console entry point (autoport_cst.cli.main, as the installed
# script does) and reports on stderr, last, whether torch was imported.
ENTRY = """
import sys
from autoport_cst.cli import main, exit_now
import autoport_cst.cli as cli_module
def report(code):
    print("torch imported" if "torch" in sys.modules else "torch not imported", file=sys.stderr)
    real_exit(code)
real_exit = cli_module.exit_now
cli_module.exit_now = report
sys.argv = ["autoport-cst", *sys.argv[1:]]
main()
"""


def run_cli(*args, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    environment = {**os.environ, "PYTHONPATH": str(ROOT / "src"), **(env or {})}
    return subprocess.run(
        [sys.executable, "-c", ENTRY, *map(str, args)],
        capture_output=True,
        text=True,
        env=environment,
        timeout=timeout,
    )
