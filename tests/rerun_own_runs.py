"""A pytest plugin for a test that runs a port's generated logit test in a
process of its own (``python -m pytest -p tests.rerun_own_runs ...``, this
checkout on ``PYTHONPATH``): the recorded validations it reruns
(``autoport_cst.validate.recorded.rerun``) run without their follow-ups.

The run the test recorded with ``autoport-cst validate`` ran them already, on
the same port, checkpoint, decode steps and seed; the rerun would repeat
them, proving nothing of the generated test the plain run does not (that it
finds its record, rebuilds or finds the checkpoint and passes). The default
suite loads this plugin; ``--run-slow`` reruns the follow-ups too
(tests/validation_depth.py).

At the end it says how many validations it shortened, so that the caller
can check that the rerun still went through
``autoport_cst.validate.api.validate_model``.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.validation_depth import follow_up_options

SHORTENED = "rerun_own_runs: validations without follow-ups:"

_calls: list[Any] = []
_full: list[Any] = []


def pytest_configure(config: pytest.Config) -> None:
    from autoport_cst.validate import api

    full = api.validate_model
    _full.append(full)

    def own_run_only(*args: Any, **options: Any) -> Any:
        _calls.append(args)
        return full(*args, **{**options, **follow_up_options(False)})

    api.validate_model = own_run_only  # recorded.rerun imports it from api when it runs


def pytest_terminal_summary(terminalreporter: Any) -> None:
    terminalreporter.write_line(f"{SHORTENED} {len(_calls)}")


def pytest_unconfigure(config: pytest.Config) -> None:
    from autoport_cst.validate import api

    if _full:
        api.validate_model = _full.pop()
