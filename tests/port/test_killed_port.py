"""A `port` killed outright while validating (SIGKILL: no rollback runs)
leaves its unvalidated port, its tiny checkpoint and OUT/.autoport-backup-*;
the next write into OUT removes all three, and leaves what was there before
(issue 18)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from autoport_cst.apply.leftovers import recover_leftovers
from autoport_cst.validate import build_tiny_checkpoint

ROOT = Path(__file__).resolve().parents[2]

KILLED_PORT = """
import os, signal, sys
from pathlib import Path
from autoport_cst.port import port
def on_stage(stage):
    if stage == "validate tp=1 fp32":
        os.kill(os.getpid(), signal.SIGKILL)
port(sys.argv[1], "x", Path(sys.argv[2]), steps=1, on_stage=on_stage)
"""


@pytest.mark.slow  # 15 s of CPU; the record it relies on: test_aborted_port_checkpoints.py
def test_a_killed_port_s_package_and_checkpoints_go_with_its_backup(tmp_path):
    source = build_tiny_checkpoint("LlamaForCausalLM", tmp_path / "source", seed=1).directory
    out = tmp_path / "out"
    kept = out / "checkpoints" / "other-tiny"
    kept.mkdir(parents=True)
    (kept / "config.json").write_text("{}")
    process = subprocess.run(
        [sys.executable, "-c", KILLED_PORT, str(source), str(out)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        timeout=600,
    )
    assert process.returncode == -signal.SIGKILL, process.stderr
    assert (out / "checkpoints" / "x-tiny" / "model.safetensors").is_file()
    assert (out / "vllm_neuron" / "model" / "registry.py").is_file()
    (line,) = recover_leftovers(out)
    assert "put back the port files" in line
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == [
        "checkpoints",
        "checkpoints/other-tiny",
        "checkpoints/other-tiny/config.json",
    ]
