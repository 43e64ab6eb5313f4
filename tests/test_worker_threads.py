"""The suite's xdist workers run torch on one intra-op thread (tests/conftest.py):
two workers on two cores with a thread per core each busy-wait for each other."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROBE = "import tests.conftest, torch; print(torch.get_num_threads())"


def _threads_after_conftest(worker: str | None) -> int:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "PYTEST_XDIST_WORKER")}
    if worker is not None:
        env["PYTEST_XDIST_WORKER"] = worker
    done = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    )
    return int(done.stdout.strip().splitlines()[-1])


def test_a_worker_imports_torch_with_one_intra_op_thread():
    assert _threads_after_conftest("gw0") == 1


def test_this_worker_runs_on_one_thread():
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        pytest.skip("not run by an xdist worker (the README's command runs two)")
    import torch

    assert torch.get_num_threads() == 1
    assert os.environ["OMP_NUM_THREADS"] == "1"  # the processes a test starts inherit it
