"""The benchmarks report what they measured: whole process and compute
only, wall and CPU time, and the TP=2 / TP=1 ratio against its target; the
README's figures say which they are."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def validate_benchmark():
    spec = importlib.util.spec_from_file_location("validate_benchmark", ROOT / "benchmarks" / "validate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def runs(tp1: float, tp2: float, code: int = 0) -> dict:
    return {
        "bare import of torch + transformers": [(2.0, 1.0, 0)] * 3,
        "validate TP=1": [(tp1, tp1 / 2, 0)] * 3,
        "validate TP=2": [(tp2, tp2 / 2, code)] * 3,
    }


def test_the_ratio_is_printed_with_its_target(validate_benchmark, capsys):
    assert validate_benchmark.ratios(runs(4.0, 4.8)) is True
    printed = capsys.readouterr().out
    assert "TP=2 / TP=1: wall 1.20x, CPU 1.20x (target <= 1.3x wall: met)" in printed
    assert "TP=1 / bare import: wall 2.00x, CPU 2.00x" in printed
    assert validate_benchmark.ratios(runs(4.0, 6.0)) is False
    assert "MISSED" in capsys.readouterr().out
    assert validate_benchmark.ratios(runs(4.0, 4.0, code=1)) is False  # a run that did not validate


def test_the_readme_figures_say_how_they_were_measured(repo_root):
    readme = (repo_root / "README.md").read_text()
    table = readme.split("| benchmark | figure | target |", 1)[1].split("\n\n", 1)[0]
    for row in re.findall(r"^\| (?:lint, one|validate a tiny).*$", table, re.M):
        assert "whole process" in row.lower() and "compute only" in row.lower(), row
        assert "CPU" in row and "wall" in row, row
        figure = row.split("|")[2]
        for part in re.split(r"(?i)whole process", figure):  # each clause says what its figures are
            if "compute only" in part.lower():
                clause = part[part.lower().index("compute only") :]
                assert "wall" in clause and "CPU" in clause, clause
    assert "load average" in readme.split("## Benchmarks", 1)[1].split("| benchmark |", 1)[0]
