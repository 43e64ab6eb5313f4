"""How deeply the default suite validates the ports of a test that ports many
architectures.

A passing TP=1 fp32 validation goes on to its follow-ups (``validate_model``):
a checkpoint of each config variant the reference declares, an FP8 KV cache
with scales and the FP8 segmented-prefill guard, then four parallel layouts;
``port`` then validates once more, follow-ups included, on a checkpoint of a
varied config (``autoport_cst.port_variants``). They prove the reference's
and the codemods' runtime paths, which architectures of one family share.
A test that ports a dozen architectures to check the research and the
codemods of each would repeat them a dozen times: most of the default
suite's time.

So in the default suite such a test validates ``full`` only the
architectures it names (one per family, at least) and the others on their
own runs: TP=1 in fp32 and bf16, the varied config and the config guards,
each without follow-ups. With ``--run-slow`` (or ``AUTOPORT_RUN_SLOW=1``)
every architecture is validated in full, as ``autoport-cst port`` does.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest


def slow_run(config: pytest.Config) -> bool:
    """Whether this run includes the slow tests (tests/conftest.py)."""
    return bool(config.getoption("--run-slow")) or os.environ.get("AUTOPORT_RUN_SLOW") == "1"


def validates_fully(config: pytest.Config, architecture: str, full: frozenset[str] | set[str]) -> bool:
    """Whether ``architecture`` is validated with its follow-ups in this run."""
    return architecture in full or slow_run(config)


def follow_up_options(full: bool) -> dict[str, bool]:
    """``validate_model``'s options: its follow-ups only when ``full``."""
    return {} if full else {"config_variants": False, "parallel_layouts": False}


@contextmanager
def without_follow_ups() -> Iterator[list[Any]]:
    """Within: ``autoport_cst.validate.validate_model`` (what ``port`` and
    ``port_variants`` call) runs no follow-ups. Yields the list of the calls
    it saw, so that a caller can check that the port went through it."""
    import autoport_cst.validate as validate
    from autoport_cst.validate.api import validate_model

    calls: list[Any] = []

    def own_runs_only(*args: Any, **options: Any) -> Any:
        calls.append(args)
        return validate_model(*args, **{**options, **follow_up_options(False)})

    missing = object()
    before = validate.__dict__.get("validate_model", missing)
    validate.validate_model = own_runs_only  # type: ignore[attr-defined]  # over the package's lazy __getattr__
    try:
        yield calls
    finally:
        if before is missing:
            del validate.validate_model
        else:
            validate.validate_model = before  # type: ignore[attr-defined]


def port_at_depth(full: bool, source: str, name: str, out: Any, **options: Any) -> Any:
    """``autoport_cst.port.port(source, name, out, **options)``, its
    validations without follow-ups unless ``full``."""
    from autoport_cst.port import port

    if full:
        return port(source, name, out, **options)
    with without_follow_ups() as calls:
        outcome = port(source, name, out, **options)
    # a port that validated must have gone through the patched function (else
    # this module no longer shortens anything: port imports validate_model elsewhere)
    assert calls or not outcome.runs, "port no longer calls autoport_cst.validate.validate_model"
    return outcome
