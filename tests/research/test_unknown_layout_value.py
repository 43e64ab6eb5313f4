"""A checkpoint layout research cannot describe is the value ``unknown``,
never a layout the checkpoint does not have (issue 15: plans say nothing
false). HRM-Text's checkpoints store its output gate, q, k and v fused in
one ``attn.gqkv_proj`` that transformers chunks at load: no spec layout
describes ``[gate | q | k | v]``. Research recorded the field as unknown but
returned ``separate`` as its value, which a consumer reading the spec alone
would believe; the value itself is now ``unknown``, and the plan is refused
for it by name."""

from __future__ import annotations

import dataclasses

import pytest

pytest.importorskip("transformers")
pytest.importorskip("torch")


@pytest.fixture(scope="module")
def hrm_config(tmp_path_factory):
    """HRM-Text's config.json alone (the layout is then transformers' own
    conversion's)."""
    from autoport_cst.validate.tiny import build_tiny_checkpoint

    root = tmp_path_factory.mktemp("hrm-unknown")
    build_tiny_checkpoint("hrm_text", root / "saved", seed=0, key_format="saved")
    (root / "config").mkdir()
    (root / "config" / "config.json").write_text((root / "saved" / "config.json").read_text())
    return root / "config"


@pytest.fixture(scope="module")
def hrm_research(hrm_config):
    from autoport_cst.research import research

    return research(str(hrm_config))


def test_the_value_itself_says_unknown(hrm_research):
    layout = hrm_research.spec.checkpoint
    assert layout.qkv == "unknown"  # was "separate", with the field listed as unknown beside it
    assert "checkpoint.qkv" in hrm_research.unknown
    assert layout.gate_up == "fused"  # the split transformers makes into [gate | up]: a spec layout


def test_the_plan_is_refused_for_it_by_name(hrm_research):
    from autoport_cst.port import refusal
    from autoport_cst.research import choose_reference

    found = hrm_research
    error = refusal(found, choose_reference(found.spec, "unknown_layout", found.architecture, None))
    assert error is not None and "checkpoint.qkv" in error.features
    assert "Q, K and V stored in a layout research could not read" in str(error)
    assert "attn.gqkv_proj" in str(error)  # the split, as transformers' conversion names it


def test_no_codemod_realizes_unknown(hrm_research):
    """The composer refuses a plan carrying ``unknown`` whatever the rest of
    it: the spec of a realizable reference with only that value changed."""
    from autoport_cst.apply.composer import compose
    from autoport_cst.apply.reference import load_reference
    from autoport_cst.errors import UnrealizableDiffError
    from autoport_cst.plan import PLAN_VERSION, Plan

    reference = load_reference("llama3")
    checkpoint = dataclasses.replace(reference.spec.checkpoint, qkv="unknown")
    spec = dataclasses.replace(reference.spec, checkpoint=checkpoint)
    plan = Plan(
        version=PLAN_VERSION,
        name="unknown_layout",
        architecture="LlamaForCausalLM",
        reference="llama3",
        spec=spec,
    )
    with pytest.raises(UnrealizableDiffError) as raised:
        compose(plan, reference)
    assert raised.value.fields == ["checkpoint.qkv"]
