"""``run_reuse``: inside ``reusing_validation_runs`` a validation asked for
again with the same options on the same files is not run again (``port --tp
2``: the TP=2 layout of the TP=1 run is the ``--tp 2`` run); outside it, or
on changed files, or for a caller that follows the stages, it is."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from autoport_cst.validate import api
from autoport_cst.validate.layout import ParallelLayout
from autoport_cst.validate.run_reuse import reused_run, reusing_validation_runs


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[Path, Path]:
    package, checkpoint = tmp_path / "pkg", tmp_path / "ckpt"
    package.mkdir()
    checkpoint.mkdir()
    (package / "__init__.py").write_text("")
    (checkpoint / "config.json").write_text('{"rms_norm_eps": 1e-06}')
    return package, checkpoint


def _counting():
    calls: list[int] = []

    def run():
        calls.append(1)
        return object()

    return calls, run


def test_a_repeated_run_is_reused_within_the_context(dirs):
    calls, run = _counting()
    with reusing_validation_runs():
        first = reused_run(*dirs, {"tp": 2, "layout": ParallelLayout(tp=2)}, run)
        again = reused_run(*dirs, {"layout": ParallelLayout(tp=2), "tp": 2}, run)
        other = reused_run(*dirs, {"tp": 2, "layout": ParallelLayout(tp=2, embedding_dp=2)}, run)
    assert again is first and other is not first
    assert len(calls) == 2


def test_outside_the_context_every_run_runs(dirs):
    calls, run = _counting()
    reused_run(*dirs, {"tp": 2}, run)
    reused_run(*dirs, {"tp": 2}, run)
    assert len(calls) == 2


def test_a_rewritten_checkpoint_runs_again(dirs):
    calls, run = _counting()
    with reusing_validation_runs():
        reused_run(*dirs, {"tp": 1}, run)
        (dirs[1] / "config.json").write_text('{"rms_norm_eps": 2e-06}')  # same size
        reused_run(*dirs, {"tp": 1}, run)
    assert len(calls) == 2


def test_validate_reuses_unless_the_caller_follows_the_stages(dirs, monkeypatch):
    calls: list[dict] = []

    @functools.wraps(api._validate_run)  # its signature: the options' defaults
    def fake(*args, **options):
        calls.append(options)
        return object()

    monkeypatch.setattr(api, "_validate_run", fake)
    options = dict(tp=2, dtype="fp32", steps=4, prompt_lengths=None, block_size=None, seed=0)
    with reusing_validation_runs():
        first = api._validate(*dirs, on_stage=None, layout=ParallelLayout(tp=2), **options)
        # an option given its default value (validate_model passes ep, the follow-ups do not)
        again = api._validate(*dirs, on_stage=None, layout=ParallelLayout(tp=2), ep=1, **options)
        assert again is first
        api._validate(*dirs, on_stage=print, layout=ParallelLayout(tp=2), **options)
    assert len(calls) == 2
