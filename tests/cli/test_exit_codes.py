"""Exit codes mean one thing each (0 done, 1 written and wrong, 2 bad input
with nothing written, 130 interrupted), and bad input is found before torch
is imported and before any process starts."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time

from click.testing import CliRunner

from autoport_cst.cli import cli

from .conftest import LLAMA3, ROOT, run_cli


def invoke(*args, **kwargs):
    return CliRunner().invoke(cli, [str(a) for a in args], **kwargs)


def test_a_tp_size_the_rules_refuse_is_bad_input_before_torch(fake_llama, tmp_path):
    validate = run_cli("validate", LLAMA3, "--hf", fake_llama, "--tp", "3")
    assert validate.returncode == 2, validate.stderr
    assert "--tp 3" in validate.stderr and "rule 1: 4 attention heads not divisible by 3" in validate.stderr
    assert "the rules accept TP 1, 2" in validate.stderr
    assert validate.stderr.rstrip().endswith("torch not imported")

    port = run_cli("port", fake_llama, "--name", "x", "--out", tmp_path / "out", "--tp", "3")
    assert port.returncode == 2, port.stderr
    assert "rule 1" in port.stderr and port.stderr.rstrip().endswith("torch not imported")
    assert not (tmp_path / "out").exists()


def test_missing_paths_are_found_before_torch(tmp_path):
    checks = [
        ("validate", tmp_path / "nope", "--hf", tmp_path),
        ("port", tmp_path / "nope", "--name", "x", "--out", tmp_path / "out"),
        ("tiny", tmp_path / "nope" / "config.json", tmp_path / "out"),
    ]
    for args in checks:
        result = run_cli(*args)
        assert result.returncode == 2, (args, result.stderr)
        assert "no such" in result.stderr
        assert result.stderr.rstrip().endswith("torch not imported"), (args, result.stderr)


def test_a_misspelt_architecture_is_found_before_torch(tmp_path):
    """`tiny LlamaForCausalLm` imported torch (5-10 s) before its "did you
    mean"; transformers' top-level module lists the class names without it."""
    result = run_cli("tiny", "LlamaForCausalLm", tmp_path / "out")
    assert result.returncode == 2, result.stderr
    assert "did you mean 'LlamaForCausalLM'?" in result.stderr
    assert result.stderr.rstrip().endswith("torch not imported"), result.stderr
    assert not (tmp_path / "out").exists()


def test_the_validate_library_refuses_the_tp_size_too(tiny_llama):
    import pytest

    from autoport_cst.errors import InputError
    from autoport_cst.validate import validate_model

    with pytest.raises(InputError, match="rule 2: 1 heads per rank is odd"):
        validate_model(LLAMA3, tiny_llama, tp=4, steps=1)


def test_a_hub_id_without_network_fails_at_once(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens on port 9 (discard)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    started = time.perf_counter()
    result = invoke("plan", "someone/some-model", "--name", "x", "-o", tmp_path / "plan.json")
    assert result.exit_code == 2, result.output
    assert "hub is unreachable" in result.output and "HF_HUB_OFFLINE" in result.output
    assert time.perf_counter() - started < 10
    assert not (tmp_path / "plan.json").exists()


def test_validate_without_the_extra_names_it(fake_llama, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # as in a core-only install
    result = invoke("validate", LLAMA3, "--hf", fake_llama)
    assert result.exit_code == 2, result.output
    assert "pip install 'autoport-cst[validate]'" in result.output
    assert "internal error" not in result.output


def test_a_port_that_cannot_load_a_valid_checkpoint_exits_1_naming_parameter_and_key(tiny_llama, tmp_path):
    port = tmp_path / "port"
    shutil.copytree(LLAMA3, port, ignore=shutil.ignore_patterns("__pycache__"))
    model = port / "model.py"
    text = model.read_text(encoding="utf-8")
    key = '.mlp.up_proj.weight"'
    assert key in text, "the anchor of the edit: the checkpoint key of the up projection"
    model.write_text(text.replace(key, '.mlp.up_projection.weight"', 1), encoding="utf-8")
    report = tmp_path / "report.json"
    result = invoke("validate", port, "--hf", tiny_llama, "--steps", "1", "--json", report)
    assert result.exit_code == 1, result.output
    assert "failed at load" in result.output
    assert "up_projection.weight" in result.output and "up_proj_weight" in result.output
    assert json.loads(report.read_text())["failure"]["stage"] == "load"


def test_ctrl_c_exits_130(fake_llama, tmp_path, monkeypatch):
    import autoport_cst.port

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(autoport_cst.port, "port", interrupted)
    result = invoke("port", fake_llama, "--name", "x", "--out", tmp_path / "out")
    assert result.exit_code == 130, result.output
    assert "interrupted" in result.output
    assert not (tmp_path / "out").exists()


def _sigint_default() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


CTRL_C_TARGET = """
import sys, time
import autoport_cst.preflight as preflight
def waiting(name, option="--name"):
    print("waiting", file=sys.stderr, flush=True)
    time.sleep(60)
preflight.check_model_name = waiting
import autoport_cst.cli.port_cmd as port_cmd
port_cmd.check_model_name = waiting
from autoport_cst.cli import main
sys.argv = ["autoport-cst", *sys.argv[1:]]
main()
"""


def test_ctrl_c_of_the_console_script_exits_130(fake_llama, tmp_path):
    process = subprocess.Popen(
        [sys.executable, "-c", CTRL_C_TARGET, "port", str(fake_llama), "--name", "x", "--out", str(tmp_path)],
        stderr=subprocess.PIPE,
        text=True,
        env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"},
        # as from a terminal: an ignored SIGINT is inherited across exec (a test
        # run before this one in the same worker may leave it ignored), and
        # Python then installs no KeyboardInterrupt handler
        preexec_fn=_sigint_default,
    )
    assert process.stderr.readline().strip() == "waiting"
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=30) == 130
    assert "interrupted" in process.stderr.read()


def test_port_prints_why_a_run_failed(capsys):
    from autoport_cst.cli.port_cmd import _print
    from autoport_cst.port import PortOutcome
    from autoport_cst.validation_runs import ValidationRun

    reason = "not equivalent: the port failed at load: no tensor 'model.norm.weight' for model.norm.weight"
    outcome = PortOutcome("x", "LlamaForCausalLM", reference="llama3")
    outcome.runs.append(ValidationRun(1, "fp32", False, reason, "failure: load", None, 0.1))
    _print(outcome)
    out = capsys.readouterr().out
    assert "tp=1 fp32: " + reason in out and "does NOT validate" in out
