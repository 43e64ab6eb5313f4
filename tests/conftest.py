"""Suite-wide options: slow, exhaustive runs are opt-in (``--run-slow`` or
``AUTOPORT_RUN_SLOW=1``); property tests run 25 examples each by default,
400 with ``HYPOTHESIS_PROFILE=thorough``, and never against a clock (a
deadline flakes on a loaded machine; speed lives in ``benchmarks/``)."""

from __future__ import annotations

import gc
import os
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "default", max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "thorough", max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

ROOT = Path(__file__).resolve().parents[1]

# A pytest-xdist worker (README's test command: -n 2) starts with COLUMNS=80 and
# LINES=24 in its environment, which the command that started the suite did not
# set; the CLI's output width honours COLUMNS, and the tests of that width
# assume the environment of the command (a pipe: 200 columns).
if os.environ.get("PYTEST_XDIST_WORKER"):
    for name in ("COLUMNS", "LINES"):
        os.environ.pop(name, None)

# One torch intra-op thread per xdist worker, and per process a test starts
# (CLI runs inherit OMP_NUM_THREADS; TP ranks set one thread themselves): two
# workers on two cores, each with an OpenMP pool of a thread per core, would
# oversubscribe the cores, and the suite's tiny models gain nothing from
# intra-op parallelism (the validator already runs on one thread). Set before
# this process imports torch (torch reads OMP_NUM_THREADS once); a value the
# caller set is kept.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


# The suite's processes hold torch, transformers and LibCST trees (millions of
# objects, most alive to the end); at the interpreter's default thresholds
# (700, 10, 10) parsing and printing a model file (a codemod run: tens of
# thousands of nodes) sets off collections of the older generations over all
# of them, a large share of the CPU of the codemod tests. Collecting less often
# changes no result: the tests' objects are freed by reference counting, and a
# cycle only later.
gc.set_threshold(50_000, 50, 100)


def pytest_configure(config):
    # README's test command (-n 2 --dist loadfile): the costliest files first (tests/xdist_order.py)
    if config.pluginmanager.hasplugin("xdist"):
        from tests import xdist_order

        config.pluginmanager.register(xdist_order, "autoport-xdist-order")


def pytest_addoption(parser):
    parser.addoption("--run-slow", action="store_true", default=False, help="run tests marked slow")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--run-slow") or os.environ.get("AUTOPORT_RUN_SLOW") == "1":
        return
    skip = pytest.mark.skip(reason="slow: run with --run-slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    """Exit promptly: the interpreter's shutdown runs full garbage collections
    over everything the suite left alive (torch, transformers, libcst trees:
    millions of objects), minutes of a loaded machine after the summary, to
    free memory the process is about to return anyway. Frozen objects are left
    out of those collections; nothing the suite checks runs after this."""
    gc.freeze()


@pytest.fixture
def repo_root() -> Path:
    return ROOT


@pytest.fixture(scope="module")
def shared_reference_runs():
    """For a module that validates ports on the same checkpoints again and
    again (``pytestmark = pytest.mark.usefixtures("shared_reference_runs")``):
    its validations on the same checkpoint files, prompts and decode steps
    share one transformers run (``reusing_reference_runs``, as ``port`` does
    for its own), whatever the port, its dtype or TP size; transformers' side
    does not depend on them. Each validation still runs and compares its port."""
    from autoport_cst.validate.reference_reuse import reusing_reference_runs

    with reusing_reference_runs():
        yield
