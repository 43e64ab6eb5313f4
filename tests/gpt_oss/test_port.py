"""``autoport-cst port`` on a tiny GPT-OSS checkpoint: research picks the
gpt_oss reference, apply only renames, registers, guards the config and
takes the steps of the declared router dtype (``tests/moe/spec_steps.py``),
and the port validates in float32 (one rank and two); its bf16 run validates
or fails only as ``explain.py`` describes for the reference."""

from __future__ import annotations

from click.testing import CliRunner

from autoport_cst.cli import cli
from tests.moe.spec_steps import IDENTITY, IDENTITY_AND_GUARDS, declared_steps

from .explain import explain_bf16_failure


def test_port_end_to_end(tiny_gpt_oss, tmp_path, request):
    from autoport_cst.apply.reference import load_reference
    from autoport_cst.research import research
    from tests.validation_depth import feature_depth, port_at_depth

    outcome = port_at_depth(
        feature_depth(request.config), str(tiny_gpt_oss), "gpt_oss_port", tmp_path, tp=2, steps=8
    )
    assert outcome.reference == "gpt_oss"
    declared = declared_steps(research(str(tiny_gpt_oss)).spec, load_reference("gpt_oss").spec)
    assert IDENTITY <= set(outcome.steps)
    assert set(outcome.steps) - IDENTITY_AND_GUARDS == declared, outcome.steps
    runs = {(run.tp, run.dtype): run for run in outcome.runs}
    assert runs[(1, "fp32")].equivalent, runs[(1, "fp32")].summary
    assert runs[(2, "fp32")].equivalent, runs[(2, "fp32")].summary
    assert (outcome.package_dir / "model.py").read_text().count("class GptOssPortExperts") == 1
    if not runs[(1, "bf16")].equivalent:
        from autoport_cst.validate import validate_model

        report = validate_model(outcome.package_dir, outcome.checkpoint_dir, dtype="bf16", steps=8)
        explain_bf16_failure(report, outcome.package_dir, outcome.checkpoint_dir, 8)


def test_the_port_validates_with_expert_parallelism(tiny_gpt_oss, tmp_path):
    from autoport_cst.validate import validate_model

    result = CliRunner().invoke(
        cli, ["apply", "--plan", str(_plan(tiny_gpt_oss, tmp_path)), "--out", str(tmp_path)]
    )
    assert result.exit_code == 0, result.output
    report = validate_model(tmp_path / "vllm_neuron" / "model" / "oss_ep", tiny_gpt_oss, tp=2, ep=2, steps=8)
    assert report.equivalent, report.summary()


def _plan(checkpoint, tmp_path):
    out = tmp_path / "oss_ep.plan.json"
    result = CliRunner().invoke(cli, ["plan", str(checkpoint), "--name", "oss_ep", "-o", str(out)])
    assert result.exit_code == 0, result.output
    return out


def test_lint_is_clean():
    from .conftest import GPT_OSS

    result = CliRunner().invoke(cli, ["lint", "--no-cache", str(GPT_OSS)])
    assert result.exit_code == 0, result.output
