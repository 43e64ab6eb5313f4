"""The qwen2 port from examples/ validates against Qwen2ForCausalLM, and the
logit test `apply` writes beside it reruns a recorded validation on its own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from autoport_cst.cli import cli
from autoport_cst.validate import build_tiny_checkpoint, validate_model
from tests.rerun_own_runs import SHORTENED
from tests.validation_depth import follow_up_options, slow_run

ROOT = Path(__file__).resolve().parents[2]
# validations on one checkpoint share its transformers run (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("shared_reference_runs")


@pytest.fixture(scope="module")
def qwen2_port(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("qwen2-port")
    result = CliRunner().invoke(
        cli, ["apply", "--plan", str(ROOT / "examples" / "qwen2.plan.json"), "--out", str(out), "-q"]
    )
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture(scope="module")
def tiny_qwen2(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("tiny-qwen2")
    build_tiny_checkpoint("Qwen2ForCausalLM", directory, seed=0)
    return directory


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_qwen2_port_validates(qwen2_port, tiny_qwen2, dtype, request):
    # the fp32 run's follow-ups (config variants, FP8, parallel layouts) with --run-slow only:
    # in the default suite the validate command of test_generated_logit_test_reruns_the_recorded_validation
    # runs them on the same port and checkpoint, and the generated test once more
    follow_ups = follow_up_options(slow_run(request.config))
    report = validate_model(
        qwen2_port / "vllm_neuron/model/qwen2", tiny_qwen2, dtype=dtype, steps=8, **follow_ups
    )
    assert report.equivalent, report.summary()


def test_the_reference_does_not_validate_against_qwen2(tiny_qwen2):
    """Without the QKV bias codemod the port is wrong, and validation says where."""
    report = validate_model(ROOT / "reference_models" / "llama3", tiny_qwen2, dtype="fp32", steps=4)
    assert not report.equivalent
    assert report.first_diverging is not None and "attention" in str(report.first_diverging)


def test_generated_logit_test_reruns_the_recorded_validation(qwen2_port, tiny_qwen2, request):
    """`validate` records its run beside the port's test; the test reruns it
    (in the default suite without the follow-ups the validate command ran
    just before on the same port, checkpoint, steps and seed:
    tests/rerun_own_runs.py; with --run-slow, with them)."""
    validated = CliRunner().invoke(
        cli,
        ["validate", str(qwen2_port / "vllm_neuron/model/qwen2"), "--hf", str(tiny_qwen2), "--steps", "4"],
    )
    assert validated.exit_code == 0, validated.output
    # its follow-ups ran: in the default suite, test_qwen2_port_validates' fp32 run leaves them to it
    assert "parallel layouts:" in validated.output, validated.output
    test = qwen2_port / "test/vllm_neuron/model/qwen2/test_qwen2_logits.py"
    shortened = [] if slow_run(request.config) else ["-p", "tests.rerun_own_runs"]
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", *shortened, str(test)],
        cwd=qwen2_port,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": path},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 passed" in result.stdout, result.stdout
    if shortened:  # the rerun went through the validation the plugin shortens
        assert f"{SHORTENED} 1" in result.stdout, result.stdout
