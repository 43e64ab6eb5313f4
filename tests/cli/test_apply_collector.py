"""`autoport-cst apply` runs with the cyclic garbage collector paused (its
imports and its work make long-lived objects and next to no cyclic garbage)
and leaves it as it found it, for a caller in the same process."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest
from click.testing import CliRunner

import autoport_cst.apply as apply_package
from autoport_cst.cli import cli
from autoport_cst.collector import collector_paused

ROOT = Path(__file__).resolve().parents[2]
QWEN2_PLAN = ROOT / "examples" / "qwen2.plan.json"


@pytest.mark.parametrize("enabled", [True, False])
def test_collector_paused_restores_the_state_it_found(enabled):
    was = gc.isenabled()
    try:
        gc.enable() if enabled else gc.disable()
        with pytest.raises(SystemExit), collector_paused():
            assert not gc.isenabled()
            raise SystemExit(0)  # a command leaves by sys.exit
        assert gc.isenabled() is enabled
    finally:
        gc.enable() if was else gc.disable()


def test_apply_runs_with_the_collector_paused_and_restores_it(tmp_path, monkeypatch):
    seen = []
    build_port = apply_package.build_port

    def recording_build_port(*args, **kwargs):
        seen.append(gc.isenabled())
        return build_port(*args, **kwargs)

    monkeypatch.setattr(apply_package, "build_port", recording_build_port)
    assert gc.isenabled()
    result = CliRunner().invoke(cli, ["apply", "--plan", str(QWEN2_PLAN), "--out", str(tmp_path), "-q"])
    assert result.exit_code == 0, result.output
    assert seen == [False]
    assert gc.isenabled()
    assert (tmp_path / "vllm_neuron" / "model" / "qwen2" / "model.py").is_file()


@pytest.mark.parametrize("enabled", [True, False])
def test_collector_left_paused_when_the_process_ends_with_the_block(enabled):
    was = gc.isenabled()
    try:
        gc.enable() if enabled else gc.disable()
        with collector_paused(lift=False):
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable() if was else gc.disable()


# The console entry point (``cli.main``) with a recorder of the collections
# that run once the command has started (its ``_apply`` called).
COUNTING_ENTRY = """
import gc, sys
import autoport_cst.cli as cli_module
import autoport_cst.cli.apply_cmd as apply_cmd
started, collections = [], []
gc.callbacks.append(lambda phase, info: started and phase == "start" and collections.append(info["generation"]))
_apply = apply_cmd._apply
def recording_apply(*args):
    started.append(True)
    return _apply(*args)
apply_cmd._apply = recording_apply
real_exit = cli_module.exit_now
def report(code):
    print(f"collections after the start: {collections}", file=sys.stderr)
    real_exit(code)
cli_module.exit_now = report
sys.argv = ["autoport-cst", *sys.argv[1:]]
cli_module.main()
"""


def test_apply_process_runs_no_collection_once_the_command_started(tmp_path):
    """The command's pause is not lifted before the process exits: lifting it
    had the next allocation collect the young generation, every object the
    command made (one collection of 0.03-0.05 s of CPU, before this change)."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    args = ["apply", "--plan", str(QWEN2_PLAN), "--out", str(tmp_path), "-q"]
    proc = subprocess.run(
        [sys.executable, "-c", COUNTING_ENTRY, *args], capture_output=True, text=True, env=env, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    assert "collections after the start: []" in proc.stderr, proc.stderr
    assert (tmp_path / "vllm_neuron" / "model" / "qwen2" / "model.py").is_file()
