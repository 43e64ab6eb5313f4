"""Research on a tiny GptOssForCausalLM checkpoint gives the gpt_oss
reference's own spec on every field it reads evidence for (the router dtype,
which it does not read, keeps the spec's float32 default: the port takes
``float32-router``, as ``tests/moe/spec_steps.py`` says), so the planner picks
gpt_oss with no other codemod; experts that compute a plain SwiGLU still differ from it on
``mlp.glu``, which no codemod realizes, so they keep qwen3_moe."""

from __future__ import annotations

import dataclasses

from click.testing import CliRunner

from autoport_cst.apply.reference import load_reference
from autoport_cst.cli import cli
from autoport_cst.plan import load_plan
from autoport_cst.research import choose_reference, research
from autoport_cst.spec import diff_specs
from tests.moe.spec_steps import declared_changes


def test_research_gives_the_reference_spec(tiny_gpt_oss):
    found = research(str(tiny_gpt_oss))
    assert found.unknown == ()
    assert found.spec.unsupported is None
    reference = load_reference("gpt_oss").spec
    diffs = diff_specs(reference, found.spec)
    # every field research reads evidence for agrees with the reference; the
    # rest are the ones research takes the spec's defaults for (the router dtype)
    assert [d for d in diffs if found.decision(d.path) is not None] == []
    assert {d.path for d in diffs} == declared_changes(found.spec, reference)
    mlp = found.spec.mlp
    assert (mlp.glu, mlp.activation, mlp.glu_alpha, mlp.glu_limit, mlp.bias) == (
        "clamped_swiglu",
        "silu",
        1.702,
        7.0,
        True,
    )
    assert found.decision("mlp.glu").source == "code"


def test_planner_chooses_gpt_oss_without_codemods(tiny_gpt_oss):
    found = research(str(tiny_gpt_oss))
    choice = choose_reference(found.spec, "gpt_oss_port", found.architecture)
    assert choice.chosen == "gpt_oss" and choice.realizable
    reference = load_reference("gpt_oss").spec
    assert set(choice.candidate("gpt_oss").code_changes) == declared_changes(found.spec, reference)
    # from the MoE reference without expert parallelism the clamped SwiGLU blocks the port
    assert "mlp.glu" in choice.candidate("qwen3_moe").blocking


def test_plain_swiglu_experts_are_refused_from_gpt_oss(tiny_gpt_oss):
    """The same model with act(gate) * up experts: gpt_oss is blocked by
    mlp.glu (no codemod turns the clamped form into the plain one or back)."""
    found = research(str(tiny_gpt_oss))
    plain = dataclasses.replace(found.spec, mlp=dataclasses.replace(found.spec.mlp, glu="standard"))
    choice = choose_reference(plain, "plain_port", found.architecture)
    assert "mlp.glu" in choice.candidate("gpt_oss").blocking
    assert choice.chosen != "gpt_oss"


def test_qwen3_moe_checkpoints_still_choose_qwen3_moe(tmp_path):
    from autoport_cst.validate import build_tiny_checkpoint

    build_tiny_checkpoint("Qwen3MoeForCausalLM", tmp_path / "q", seed=0)
    found = research(str(tmp_path / "q"))
    choice = choose_reference(found.spec, "q", found.architecture)
    assert choice.chosen == "qwen3_moe"
    assert "mlp.glu" in choice.candidate("gpt_oss").blocking


def test_plan_cli_writes_a_gpt_oss_plan(tiny_gpt_oss, tmp_path):
    out = tmp_path / "plan.json"
    result = CliRunner().invoke(cli, ["plan", str(tiny_gpt_oss), "--name", "gpt_oss_port", "-o", str(out)])
    assert result.exit_code == 0, result.output
    plan = load_plan(out)
    assert plan.reference == "gpt_oss"
    assert plan.spec.mlp.glu == "clamped_swiglu"
