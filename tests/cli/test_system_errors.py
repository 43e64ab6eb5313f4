"""An error of the system (a full disk, a missing permission) is reported
as a system error naming the file, exit 2, never as our internal error
(issue 18, item 4: `plan -o /dev/full` said "internal error: OSError")."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from autoport_cst.cli.common import describe_unexpected

ROOT = Path(__file__).resolve().parents[2]


def test_a_system_error_names_its_file_and_cause():
    error = PermissionError(13, "Permission denied", "/etc/plan.json")
    assert describe_unexpected(error) == "system error: /etc/plan.json: Permission denied"


def test_an_error_of_ours_is_still_called_internal():
    assert describe_unexpected(KeyError("x")) == "internal error: KeyError: 'x'"


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_output_to_a_full_disk_exits_2_as_a_system_error():
    with open("/dev/full", "w") as full:
        result = subprocess.run(
            [sys.executable, "-m", "autoport_cst", "lint", "--list-rules"],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
            timeout=120,
        )
    assert result.returncode == 2
    assert "system error" in result.stderr and "No space left on device" in result.stderr
    assert "internal error" not in result.stderr
