"""The apply summary in a pipe: aligned plain text, and no import of rich."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from autoport_cst.cli.plain_table import plain_table

ROOT = Path(__file__).resolve().parents[2]


def test_columns_align_and_numbers_align_right():
    text = plain_table(
        "t: title", ("#", "name", "n"), [("1", "a", "10"), ("12", "long-name", "2")], right=(0, 2)
    )
    assert text.splitlines() == [
        "t: title",
        " #  name        n",
        "--  ---------  --",
        " 1  a          10",
        "12  long-name   2",
    ]


def test_apply_in_a_pipe_prints_the_table_without_rich(tmp_path):
    run = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "autoport_cst", "apply"]
        + ["--plan", str(ROOT / "examples/qwen2.plan.json"), "--out", str(tmp_path), "--force"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    lines = run.stdout.splitlines()
    assert lines[0] == "qwen2: ported from llama3"
    assert lines[1].split() == ["#", "codemod", "origin", "realizes", "files", "changed", "text", "edits"]
    assert any(line.split()[:2] == ["1", "rename-classes"] for line in lines)
    assert re.fullmatch(rf"wrote \d+ file\(s\) under {re.escape(str(tmp_path))} \(.*\)", lines[-1])
    imported = [
        line.split("|")[-1].strip() for line in run.stderr.splitlines() if line.startswith("import time:")
    ]
    assert "libcst" in imported
    assert not [name for name in imported if name.split(".")[0] == "rich"]
