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


def test_port_reports_its_stages_when_piped(fake_llama, tmp_path, monkeypatch):
    import autoport_cst.port
    from autoport_cst.port import PortOutcome

    def staged(source, name, out, *, on_stage, **kwargs):
        for stage in ("research", "apply", "checkpoint", "validate tp=1 fp32"):
            on_stage(stage)
        return PortOutcome(name, "LlamaForCausalLM")

    monkeypatch.setattr(autoport_cst.port, "port", staged)
    result = CliRunner().invoke(cli, ["port", str(fake_llama), "--name", "x", "--out", str(tmp_path)])
    stages = [line.split("...")[0] for line in result.stderr.splitlines() if line.startswith("port: ")]
    assert stages[:4] == ["port: research", "port: apply", "port: checkpoint", "port: validate tp=1 fp32"]


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
