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
