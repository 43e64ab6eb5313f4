"""Feedback while waiting: one line per stage on stderr when it is not a
terminal; and the console script leaves as soon as the verdict is out."""

from __future__ import annotations

import io
import subprocess
import sys
import time

from click.testing import CliRunner
from rich.console import Console

from autoport_cst.cli import cli
from autoport_cst.cli.progress import StageProgress

from .conftest import LLAMA3, ROOT


def test_one_plain_line_per_stage_when_piped(capsys):
    with StageProgress("validate") as progress:
        for stage in ("load port", "load port", "reference fp32", "compare"):
            progress.stage(stage)
    lines = capsys.readouterr().err.splitlines()
    assert [line.split("...")[0] for line in lines[:3]] == [
        "validate: load port",
        "validate: reference fp32",
        "validate: compare",
    ]
    assert "(load port took" in lines[1]
    assert lines[3].startswith("validate: done in ")


def test_a_live_status_on_a_terminal(capsys):
    terminal = Console(file=io.StringIO(), force_terminal=True)
    with StageProgress("port", console=terminal) as progress:
        progress.stage("research")
    assert capsys.readouterr().err == ""  # no plain lines: the status is drawn on the terminal
    assert progress.live


def test_validate_reports_its_stages_when_piped(tiny_llama):
    result = CliRunner().invoke(cli, ["validate", str(LLAMA3), "--hf", str(tiny_llama), "--steps", "1"])
    assert result.exit_code == 0, result.output
    stages = [line.split("...")[0] for line in result.stderr.splitlines() if line.startswith("validate: ")]
    assert stages[:4] == [
        "validate: load port",
        "validate: reference fp32",
        "validate: reference bf16",
        "validate: run port",
    ]
    # the follow-ups of a passing plain run (config variants, parallel layouts): a line each
    assert "validate: config variant 1" in stages
    assert "validate: parallel layout 1 (tp=2)" in stages
    assert len([s for s in stages if s.startswith("validate: parallel layout ")]) >= 4


def test_follow_up_runs_are_announced_in_order():
    import doctest

    from autoport_cst.validate import follow_up_stages

    assert doctest.testmod(follow_up_stages).failed == 0
    run = object()
    assert follow_up_stages.announced(run, None, "config variant") is run  # nobody to tell


def test_port_reports_the_stages_of_its_tp1_runs(tmp_path, monkeypatch):
    """The TP=1 runs pass their stages (and their follow-ups') on; the --tp
    run, the TP=1 run's layout of that size (run_reuse), stays one stage."""
    from types import SimpleNamespace

    import autoport_cst.validate
    from autoport_cst import port as port_module
    from autoport_cst.port import PortOutcome

    calls = []

    def fake_validate(package, checkpoint, *, tp, dtype, steps, seed, on_stage=None):
        calls.append((tp, dtype, on_stage is not None))
        if on_stage is not None:
            on_stage("parallel layout 1 (tp=2)")
        return SimpleNamespace(equivalent=True, failure=None, summary=lambda: "equivalent")

    monkeypatch.setattr(autoport_cst.validate, "validate_model", fake_validate)
    monkeypatch.setattr(port_module, "first_diverging", lambda report: None)
    monkeypatch.setattr(port_module, "max_abs", lambda report: 0.0)
    (tmp_path / "config.json").write_text('{"model_type": "llama"}', encoding="utf-8")
    outcome = PortOutcome("x", "LlamaForCausalLM")
    outcome.checkpoint_dir = tmp_path
    seen: list[str] = []
    port_module._validation_runs(outcome, "tiny", 2, 1, 0, seen.append)
    assert seen == [
        "validate tp=1 fp32",
        "validate tp=1 fp32: parallel layout 1 (tp=2)",
        "validate tp=1 bf16",
        "validate tp=1 bf16: parallel layout 1 (tp=2)",
        "validate tp=2 fp32",
    ]
    assert calls == [(1, "fp32", True), (1, "bf16", True), (2, "fp32", False)]


# A module global whose finalizer takes 5 s: the interpreter's teardown runs
# it, a prompt exit does not.
SLOW_TEARDOWN = """
import atexit, sys, time
class Slow:
    def __del__(self):
        time.sleep(5)
keep = Slow()
atexit.register(lambda: print("atexit ran", file=sys.stderr, flush=True))
from autoport_cst.cli import main
sys.argv = ["autoport-cst", *sys.argv[1:]]
main()
"""


def test_the_console_script_exits_promptly_with_its_code_and_output():
    env = {"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"}
    for args, code in ((["schema", "plan"], 0), (["codemods", "show", "no-such-codemod"], 2)):
        started = time.perf_counter()
        result = subprocess.run(
            [sys.executable, "-c", SLOW_TEARDOWN, *args], capture_output=True, text=True, env=env, timeout=60
        )
        assert result.returncode == code, result.stderr
        assert time.perf_counter() - started < 4.5, "the interpreter's teardown ran"
        assert "atexit ran" in result.stderr
    assert result.stderr.startswith("error: unknown codemod")
    plan_schema = subprocess.run(
        [sys.executable, "-c", SLOW_TEARDOWN, "schema", "plan"], capture_output=True, env=env, timeout=60
    )
    assert plan_schema.stdout.rstrip().endswith(b"}"), "the output is flushed whole"
