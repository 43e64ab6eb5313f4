"""Ctrl-C during `port` after the apply stage, before the verdict: exit 130
and no port of this run stays registered under --out; an earlier port there
(replaced with --force) is put back byte for byte."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from autoport_cst.validate import build_tiny_checkpoint
from tests.validation_depth import OWN, port_at_depth

ROOT = Path(__file__).resolve().parents[2]
REGISTRY = "vllm_neuron/model/registry.py"


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("tiny-llama")
    build_tiny_checkpoint("LlamaForCausalLM", directory, seed=1)
    return directory


def _sigint_default() -> None:
    # as from a terminal: an ignored SIGINT is inherited across exec
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(*args) -> subprocess.Popen:
    """The console entry point with its stderr piped: one progress line per stage."""
    return subprocess.Popen(
        [sys.executable, "-m", "autoport_cst", *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        preexec_fn=_sigint_default,
    )


def _interrupt_while_validating(process: subprocess.Popen, out: Path) -> tuple[int, list[str], dict]:
    """Send SIGINT once the progress says the first validation run started
    (research, apply and checkpoint done); the exit code, stderr and the
    port's files as they were when the signal was sent."""
    assert process.stderr is not None
    lines = []
    for line in process.stderr:
        lines.append(line)
        if line.startswith("port: validate tp=1 fp32..."):
            written = _files(out)
            process.send_signal(signal.SIGINT)
            break
    else:
        pytest.fail(f"port ended before validating: {''.join(lines)}")
    lines.extend(process.stderr)
    return process.wait(timeout=120), lines, written


def _files(root: Path) -> dict[str, bytes]:
    """The port's files under root (not the validation checkpoints, nor bytecode)."""
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts and "checkpoints" not in p.relative_to(root).parts
    }


def test_ctrl_c_while_validating_keeps_no_port_and_restores_an_earlier_one(tiny_llama, tmp_path):
    out = tmp_path / "out"
    code, stderr, written = _interrupt_while_validating(
        _start("port", tiny_llama, "--name", "llama", "--out", out), out
    )
    text = "".join(stderr)
    assert code == 130, text
    assert REGISTRY in written, "the port was written and registered before the verdict"
    assert any(line.startswith("port: apply...") for line in stderr), text
    assert "no port of this run is kept" in text
    assert not (out / REGISTRY).exists(), "an unvalidated port is registered"
    assert not (out / "vllm_neuron").exists() and not (out / "plans").exists(), _files(out)
    assert not [p.name for p in out.iterdir() if p.name.startswith(".autoport-")]

    # an earlier port, validated (its own runs, without the follow-ups: what it
    # writes is the same), then replaced with --force from another path (its plan
    # names the source, so this run writes over it) and interrupted
    done = port_at_depth(OWN, str(tiny_llama), "llama", out)
    assert done.validated, done
    earlier = _files(out)
    assert REGISTRY in earlier and "plans/llama.plan.json" in earlier
    moved = tmp_path / "elsewhere"
    shutil.copytree(tiny_llama, moved)
    code, stderr, written = _interrupt_while_validating(
        _start("port", moved, "--name", "llama", "--out", out, "--force"), out
    )
    assert code == 130, "".join(stderr)
    assert written["plans/llama.plan.json"] != earlier["plans/llama.plan.json"]  # this run wrote over it
    assert _files(out) == earlier
    assert not [p.name for p in out.iterdir() if p.name.startswith(".autoport-")]
