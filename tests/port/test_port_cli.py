"""`autoport-cst port`: research, apply and validate in one command."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from autoport_cst.cli import cli
from autoport_cst.validate import build_tiny_checkpoint
from tests.validation_depth import follow_up_options, slow_run, without_follow_ups

ROOT = Path(__file__).resolve().parents[2]


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def run_without_follow_ups(config: pytest.Config, *args):
    """``run``, the port's validations without their follow-ups unless
    --run-slow: ``test_port_validates_a_llama`` runs them on this same
    checkpoint (tests/validation_depth.py)."""
    if slow_run(config):
        return run(*args)
    with without_follow_ups() as calls:
        result = run(*args)
    assert calls, "port no longer calls autoport_cst.validate.validate_model"
    return result


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("llama")
    build_tiny_checkpoint("LlamaForCausalLM", directory, seed=1)
    return directory


def test_port_validates_a_llama(tiny_llama, tmp_path, request):
    """The whole command, its validations with every follow-up on the
    planned config; on the varied config the command asks for them too, and
    they run with --run-slow (the same port, layouts and cache dtypes again
    on other field values: tests/validation_depth.py). The other tests of
    ``port`` run none."""
    report = tmp_path / "outcome.json"
    args = ("port", tiny_llama, "--name", "my_llama", "--out", tmp_path / "out", "--json", report)
    if slow_run(request.config):
        result = run(*args)
    else:
        asked: list = []
        with without_follow_ups(planned_too=False, asked=asked):
            result = run(*args)
        # the planned fp32 and bf16 runs, then the varied config's, each with the follow-ups asked for
        assert [(Path(a[1]).name, o.get("dtype")) for a, o in asked] == [
            ("my_llama-tiny", "fp32"),
            ("my_llama-tiny", "bf16"),
            ("my_llama-tiny-variant", "fp32"),
        ]
        assert not [o for _, o in asked if any(o.get(k) is False for k in follow_up_options(False))], asked
    assert result.exit_code == 0, result.output
    assert "PORTED and validated" in result.output
    outcome = json.loads(report.read_text())
    assert outcome["validated"] and outcome["reference"] == "llama3"
    assert [(r["tp"], r["dtype"]) for r in outcome["runs"]] == [(1, "fp32"), (1, "bf16")]
    assert (tmp_path / "out/vllm_neuron/model/my_llama/model.py").is_file()
    assert (tmp_path / "out/plans/my_llama.plan.json").is_file()
    # the port's logit test reruns what it was validated on: the tiny checkpoint
    # of the model's own config (by config and weights seed), each run
    recorded = json.loads((tmp_path / "out/test/vllm_neuron/model/my_llama/validated.json").read_text())
    validated_on = json.loads((tmp_path / "out/checkpoints/my_llama-tiny/config.json").read_text())
    planned = [r for r in recorded["runs"] if r["label"] != "variant"]
    assert [(r["tp"], r["dtype"], r["weights_seed"]) for r in planned] == [(1, "fp32", 0), (1, "bf16", 0)]
    assert all(r["config"] == validated_on for r in planned)


def test_port_at_tp2(tiny_llama, tmp_path, request):
    report = tmp_path / "outcome.json"
    result = run_without_follow_ups(
        request.config,
        "port",
        tiny_llama,
        "--name",
        "my_llama",
        "--out",
        tmp_path / "out",
        "--tp",
        "2",
        "--json",
        report,
    )
    assert result.exit_code == 0, result.output
    runs = json.loads(report.read_text())["runs"]
    assert [(r["tp"], r["dtype"], r["equivalent"]) for r in runs][-1] == (2, "fp32", True)


def test_a_port_that_does_not_validate_exits_1(tiny_llama, tmp_path):
    """A reference with a wrong RMSNorm gives a port that is written but fails
    validation, naming the first diverging component."""
    ref = tmp_path / "ref"
    shutil.copytree(ROOT / "reference_models" / "llama3", ref, ignore=shutil.ignore_patterns("__pycache__"))
    model = ref / "model.py"
    text = model.read_text()
    wrong = "hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)"
    assert text.count(wrong) == 1
    model.write_text(text.replace(wrong, wrong.replace("variance + ", "2 * variance + ")))
    result = run("port", tiny_llama, "--name", "my_llama", "--out", tmp_path / "out", "--ref", ref)
    assert result.exit_code == 1, result.output
    assert "does NOT validate" in result.output
    assert "input_norm" in result.output


def test_an_unrealizable_feature_is_refused_by_name(tmp_path):
    source = tmp_path / "mixtral"
    build_tiny_checkpoint("MixtralForCausalLM", source, seed=0)
    result = run("port", source, "--name", "my_mixtral", "--out", tmp_path / "out", "--ref", "llama3")
    assert result.exit_code == 2, result.output
    assert "moe" in result.output
    assert not (tmp_path / "out").exists()


def test_bad_input(tmp_path):
    result = run("port", tmp_path / "missing", "--name", "x", "--out", tmp_path / "out")
    assert result.exit_code == 2
    assert "error:" in result.output
    result = run("port", tmp_path, "--name", "Not-Snake", "--out", tmp_path / "out")
    assert result.exit_code == 2 and "snake_case" in result.output


def test_seed_is_used_and_recorded(tiny_llama, tmp_path, request):
    """--seed sets the tiny checkpoint's weights and the prompts; the JSON
    outcome records it."""
    report = tmp_path / "outcome.json"
    result = run_without_follow_ups(
        request.config,
        "port",
        tiny_llama,
        "--name",
        "seeded",
        "--out",
        tmp_path / "out",
        "--seed",
        "3",
        "--json",
        report,
    )
    assert result.exit_code == 0, result.output
    data = json.loads(report.read_text())
    assert data["seed"] == 3 and data["validated"] is True
    expected = build_tiny_checkpoint(str(Path(tiny_llama) / "config.json"), tmp_path / "seed3", seed=3)
    built = Path(data["checkpoint"]) / "model.safetensors"
    assert built.read_bytes() == (expected.directory / "model.safetensors").read_bytes()
