"""benchmarks/port.py prints the port's whole-process ratios to the import
floor and to the import of the model class, per round, against its target."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("port_benchmark", ROOT / "benchmarks" / "port.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def runs(bench, port_cpu: float, code: int = 0) -> dict:
    return {
        bench.FLOOR: [(4.0, 2.0, 0), (8.0, 4.0, 0), (6.0, 3.0, 0)],
        bench.MODEL_CLASS: [(8.0, 4.0, 0), (16.0, 8.0, 0), (12.0, 6.0, 0)],
        bench.PORT: [(2 * c, c, code) for c in (2.0 * port_cpu, 4.0 * port_cpu, 3.0 * port_cpu)],
    }


def test_ratios_per_round_against_the_target(bench, capsys):
    assert bench.report(runs(bench, 1.1)) is True
    printed = capsys.readouterr().out
    assert "port / bare import: CPU 1.10x, wall 1.10x (target <= 1.2x in CPU time: met)" in printed
    assert "port / import of the model class: CPU 0.55x, wall 0.55x\n" in printed
    assert "model class / bare import: CPU 2.00x, wall 2.00x" in printed
    assert bench.report(runs(bench, 2.5)) is False
    assert "MISSED" in capsys.readouterr().out
    assert bench.report(runs(bench, 1.0, code=1)) is False  # a port that did not validate


def test_the_commands_are_what_a_user_runs(bench, tmp_path):
    commands = bench.commands(tmp_path / "ckpt", tmp_path / "out")
    assert commands[bench.FLOOR][-1] == "import torch, transformers"
    assert commands[bench.PORT][2:5] == ["autoport_cst", "port", str(tmp_path / "ckpt")]
    assert "--force" in commands[bench.PORT]
