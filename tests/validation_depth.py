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

A port validated ``full`` runs the follow-ups twice: on the planned config,
then again on the varied one. The second pass proves nothing of the
codemods the first does not (the same port, layouts and cache dtypes, on
other field values, which the varied run itself already covers), so in
the default suite a test ports at ``PLANNED`` depth (follow-ups on the
planned config only). The one that checks the whole of ``autoport-cst
port`` (``tests/port/test_port_cli.py``'s ``test_port_validates_a_llama``)
checks there that ``port`` asks for the follow-ups on the varied config too
(``without_follow_ups``' ``asked``), and runs them with --run-slow.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

# depths of a port's validations (``port_at_depth``)
FULL = "full"  # as ``autoport-cst port``: follow-ups on the planned and the varied config
PLANNED = "planned"  # follow-ups on the planned config only
OWN = "own"  # no follow-ups


def slow_run(config: pytest.Config) -> bool:
    """Whether this run includes the slow tests (tests/conftest.py)."""
    return bool(config.getoption("--run-slow")) or os.environ.get("AUTOPORT_RUN_SLOW") == "1"


def validates_fully(config: pytest.Config, architecture: str, full: frozenset[str] | set[str]) -> bool:
    """Whether ``architecture`` is validated with its follow-ups in this run."""
    return architecture in full or slow_run(config)


def port_depth(config: pytest.Config, architecture: str, full: frozenset[str] | set[str]) -> str:
    """The depth of a port of ``architecture`` in this run: ``FULL`` with
    --run-slow, else ``PLANNED`` for the architectures in ``full``, ``OWN``
    for the others."""
    if slow_run(config):
        return FULL
    return PLANNED if architecture in full else OWN


def feature_depth(config: pytest.Config) -> str:
    """The depth of a test's port of the one architecture that shows its
    feature: ``FULL`` with --run-slow, else ``PLANNED``."""
    return FULL if slow_run(config) else PLANNED


def follow_up_options(full: bool) -> dict[str, bool]:
    """``validate_model``'s options: its follow-ups only when ``full``."""
    return {} if full else {"config_variants": False, "parallel_layouts": False}


@contextmanager
def without_follow_ups(planned_too: bool = True, asked: list[Any] | None = None) -> Iterator[list[Any]]:
    """Within: ``autoport_cst.validate.validate_model`` (what ``port`` and
    ``port_variants`` call) runs no follow-ups; with ``planned_too`` false,
    except on the first checkpoint it validates (``port``'s planned config:
    its follow-ups run there, not on ``port_variants``' varied config).
    Yields the list of the calls it saw, so that a caller can check that the
    port went through it; ``asked`` gets each call's ``(args, options)`` as
    the caller gave them, before the follow-ups are turned off."""
    import autoport_cst.validate as validate
    from autoport_cst.validate.api import validate_model

    calls: list[Any] = []

    def own_runs_only(*args: Any, **options: Any) -> Any:
        calls.append(args)
        if asked is not None:
            asked.append((args, dict(options)))
        if not planned_too and calls[0][1:2] == args[1:2]:  # the first call's checkpoint
            return validate_model(*args, **options)
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


def port_at_depth(depth: str, source: str, name: str, out: Any, **options: Any) -> Any:
    """``autoport_cst.port.port(source, name, out, **options)``, its
    validations at ``depth`` (``FULL``, ``PLANNED`` or ``OWN``)."""
    from autoport_cst.port import port

    if depth == FULL:
        return port(source, name, out, **options)
    assert depth in (PLANNED, OWN), depth
    with without_follow_ups(planned_too=depth == OWN) as calls:
        outcome = port(source, name, out, **options)
    # a port that validated must have gone through the patched function (else
    # this module no longer shortens anything: port imports validate_model elsewhere)
    assert calls or not outcome.runs, "port no longer calls autoport_cst.validate.validate_model"
    return outcome
