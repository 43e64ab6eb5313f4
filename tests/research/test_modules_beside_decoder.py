"""Modules with weights beside the decoder and the LM head are named, by
their outermost module, so that no plan ports the text model a causal LM
wraps without them (Fuyu's image-patch embedding was dropped by a port that
planned as portable)."""

from __future__ import annotations

import pytest

FIELD = "unsupported.modules_beside_decoder"


@pytest.fixture(scope="module")
def researched(tmp_path_factory):
    from autoport_cst.research import research
    from autoport_cst.validate import build_tiny_checkpoint

    root = tmp_path_factory.mktemp("beside")

    def get(architecture: str):
        build_tiny_checkpoint(architecture, root / architecture, seed=0)
        return research(str(root / architecture))

    return get


def _named(found) -> list[str]:
    return [f.evidence for f in found.findings if f.field == FIELD and f.known]


def test_fuyu_s_image_patch_embedding_is_named_and_refused(researched):
    found = researched("FuyuForCausalLM")
    assert _named(found) == [
        "FuyuForCausalLM holds model.vision_embed_tokens (linear) beside its decoder "
        "(model.language_model) and its head (lm_head)"
    ]
    assert any(u.startswith("modules_beside_decoder:") for u in found.spec.unsupported or ())


def test_a_second_layer_stack_is_named_by_its_outermost_module(researched):
    """HRM-Text's H_module beside the L_module research reads as the decoder:
    one name, not every projection under it."""
    (evidence,) = _named(researched("HrmTextForCausalLM"))
    assert "model.H_module (" in evidence and "H_module.layers" not in evidence


@pytest.mark.parametrize("architecture", ["LlamaForCausalLM", "OPTForCausalLM", "GPT2LMHeadModel"])
def test_decoders_with_their_embeddings_and_head_only_are_not_named(researched, architecture):
    assert _named(researched(architecture)) == []
