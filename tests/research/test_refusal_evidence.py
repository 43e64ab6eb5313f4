"""``plan`` names what refuses a model with the research's evidence for it,
as ``port`` does: a blocking spec field is shown with how research read it."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from autoport_cst.cli import cli

pytest.importorskip("transformers")

# DiffLlama's attention subtracts two softmax maps: attention.kind = differential blocks every reference
EVIDENCE = "the attention kernel is called 2 times and combined"


@pytest.fixture(scope="module")
def diffllama(tmp_path_factory):
    from autoport_cst.research import research
    from autoport_cst.validate import build_tiny_checkpoint

    source = tmp_path_factory.mktemp("evidence") / "diffllama"
    build_tiny_checkpoint("DiffLlamaForCausalLM", source, seed=0)
    return source, research(str(source))


def test_the_reference_choice_names_a_blocking_field_with_its_evidence(diffllama):
    from autoport_cst.research import choose_reference

    _, found = diffllama
    choice = choose_reference(found.spec, "diffllama", found.architecture, found=found)
    assert not choice.realizable
    assert "[attention.kind]" in choice.reason and EVIDENCE in choice.reason, choice.reason


def test_plan_prints_the_evidence(diffllama, tmp_path):
    source, _ = diffllama
    result = CliRunner().invoke(cli, ["plan", str(source), "-o", str(tmp_path / "plan.json")])
    assert result.exit_code == 1, result.output
    not_portable = [line for line in result.output.splitlines() if line.startswith("not portable:")]
    assert not_portable and EVIDENCE in not_portable[0], result.output
