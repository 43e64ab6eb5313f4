"""Ports of checkpoints written as save_pretrained writes them (hub key
names: GPT-NeoX's embed_out, GraniteMoE's router.layer and
input/output_linear, HY-V3's router.gate and expert_bias, ERNIE's
moe_statics, experts per expert): the key map comes from the header, the
port loads them, and the tiny validation checkpoint names its tensors as the
source does."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    from autoport_cst.validate.tiny import build_tiny_checkpoint

    root = tmp_path_factory.mktemp("saved")

    def build(model_type: str):
        directory = root / model_type
        if not directory.is_dir():
            build_tiny_checkpoint(model_type, directory, seed=5, key_format="saved")
        return directory

    return build


def test_the_validation_checkpoint_names_its_tensors_as_the_source_does(saved, tmp_path):
    from autoport_cst.port import _validation_checkpoint
    from autoport_cst.research.checkpoint import read_checkpoint
    from autoport_cst.validate.tiny import key_format_of

    source = saved("gpt_neox")
    found = SimpleNamespace(source=str(source), architecture="GPTNeoXForCausalLM")
    tiny = _validation_checkpoint(found, tmp_path, "neox", "tiny", 0, {})
    assert "embed_out.weight" in read_checkpoint(tiny).tensors and key_format_of(tiny) == "saved"


@pytest.mark.slow
def test_gpt_neox_saved_by_transformers_ports_and_validates(saved, tmp_path):
    from autoport_cst.port import port

    outcome = port(str(saved("gpt_neox")), "neox", tmp_path, checkpoint="source")
    assert outcome.validated, [r.summary for r in outcome.runs]
    plan = (tmp_path / "plans" / "neox.plan.json").read_text()
    assert '"lm_head": "embed_out"' in plan


@pytest.mark.slow
def test_granitemoe_saved_by_transformers_loads_its_router_and_experts(saved, tmp_path):
    from autoport_cst.port import port

    outcome = port(str(saved("granitemoe")), "gmoe", tmp_path, checkpoint="source")
    fp32 = outcome.runs[0]
    # bf16 routing near-ties are the MoE gate policy's business; the keys are this test's
    assert (fp32.tp, fp32.dtype) == (1, "fp32") and fp32.equivalent, fp32.summary


@pytest.mark.slow
@pytest.mark.parametrize("model_type", ["hy_v3", "ernie4_5_moe"])
def test_routing_bias_and_per_expert_tensors_under_their_own_names_load(saved, tmp_path, model_type):
    # HY-V3: router.gate, expert_bias, shared_mlp; ERNIE: moe_statics; both
    # store the experts one tensor per expert
    from autoport_cst.port import port

    outcome = port(str(saved(model_type)), "moe", tmp_path, checkpoint="source")
    fp32 = outcome.runs[0]
    assert (fp32.tp, fp32.dtype) == (1, "fp32") and fp32.equivalent, fp32.summary
