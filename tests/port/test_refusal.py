"""What a refusal names: the features no reference realizes (those blocking
every candidate), in the user's terms; when no feature blocks them all, the
blockers of the reference the choice calls closest, with its name. The
message and the named features agree."""

from __future__ import annotations

from types import SimpleNamespace

from autoport_cst.port import refusal
from autoport_cst.research.reference_choice import Candidate, FieldPlan, ReferenceChoice


def _candidate(name: str, blocking: tuple[str, ...], extra_fields: int) -> Candidate:
    fields = tuple(FieldPlan(path, None, None, "blocked") for path in blocking) + tuple(
        FieldPlan(f"config.field{i}", None, None, "config") for i in range(extra_fields)
    )
    return Candidate(name, False, fields, (), blocking)


def test_a_tie_on_blockers_names_the_closest_candidate_fields() -> None:
    # equal blocker counts: the choice names "b_ref" closest (the smaller diff)
    a = _candidate("a_ref", ("mlp.kind",), extra_fields=5)
    b = _candidate("b_ref", ("norm.kind",), extra_fields=1)
    choice = ReferenceChoice("b_ref", False, (a, b), "no reference realizes this diff; closest: b_ref")
    found = SimpleNamespace(architecture="XForCausalLM", spec=SimpleNamespace(unsupported=[]))
    error = refusal(found, choice)
    assert error is not None and error.features == ["norm.kind"]
    assert "the closest, b_ref, does not realize" in str(error) and "[norm.kind]" in str(error)


def test_unsupported_computations_are_named_one_by_one() -> None:
    closest = _candidate("ref", ("unsupported",), extra_fields=0)
    choice = ReferenceChoice("ref", False, (closest,), "closest: ref")
    spec = SimpleNamespace(unsupported=["mamba_mixer: modeling_x.py:12 selective scan", "cross_attention"])
    error = refusal(SimpleNamespace(architecture="XForCausalLM", spec=spec), choice)
    assert error.features == ["mamba_mixer", "cross_attention"]
    assert "no reference realizes mamba_mixer (modeling_x.py:12 selective scan); cross_attention" in str(
        error
    )


def test_a_realizable_choice_is_not_refused() -> None:
    choice = ReferenceChoice("ref", True, (Candidate("ref", True, (), (), ()),), "ref: realizable")
    assert refusal(SimpleNamespace(architecture="X", spec=SimpleNamespace(unsupported=[])), choice) is None


def _spec(**fields):
    from autoport_cst.spec import ArchSpec, EmbeddingSpec

    return ArchSpec(embedding=EmbeddingSpec(learned_positions=True), **fields)


def test_features_no_reference_realizes_not_an_unrelated_candidate_s_blockers() -> None:
    # a dense model with learned positions: gpt_oss would also need sinks,
    # biases and experts, which say nothing about why the model is refused
    gpt_oss = _candidate(
        "gpt_oss",
        ("attention.qkv_bias", "attention.sinks", "mlp.bias", "moe", "embedding.learned_positions"),
        extra_fields=0,
    )
    llama3 = _candidate("llama3", ("embedding.learned_positions",), extra_fields=3)
    starcoder2 = _candidate("starcoder2", ("embedding.learned_positions", "mlp.kind"), extra_fields=0)
    choice = ReferenceChoice("llama3", False, (gpt_oss, llama3, starcoder2), "")
    decisions = {"embedding.learned_positions": "GPT2Model.forward adds wpe to the token embedding"}
    found = SimpleNamespace(
        architecture="GPT2LMHeadModel",
        model_type="gpt2",
        spec=_spec(),
        decision=lambda path: SimpleNamespace(evidence=decisions[path]) if path in decisions else None,
    )
    error = refusal(found, choice)
    assert error.features == ["embedding.learned_positions"] and error.fields == [
        "embedding.learned_positions"
    ]
    first = str(error).splitlines()[0]
    assert first == (
        "GPT2LMHeadModel cannot be ported: no reference realizes learned absolute position embeddings "
        "[embedding.learned_positions] (gpt2: GPT2Model.forward adds wpe to the token embedding)"
    )
    assert "sinks" not in str(error) and "moe" not in str(error)


def test_the_choice_s_reason_names_the_same_features() -> None:
    from autoport_cst.research.refusal import refusal_text

    a = _candidate("a_ref", ("attention.sinks", "embedding.learned_positions"), extra_fields=0)
    b = _candidate("b_ref", ("embedding.learned_positions",), extra_fields=0)
    text, named = refusal_text(_spec(), ReferenceChoice("b_ref", False, (a, b), ""))
    assert text == "no reference realizes learned absolute position embeddings [embedding.learned_positions]"
    assert [b.field for b in named] == ["embedding.learned_positions"]


def test_an_unclassified_field_is_named_as_not_classified() -> None:
    closest = _candidate("ref", ("unsupported",), extra_fields=0)
    spec = SimpleNamespace(unsupported=["embedding.scale: the first layer's input is not traced to wte"])
    error = refusal(
        SimpleNamespace(architecture="X", spec=spec), ReferenceChoice("ref", False, (closest,), "")
    )
    assert "the embedding scale, which research could not classify [embedding.scale]" in str(error)


def test_a_codemod_no_reference_s_code_fits_is_named_in_the_user_s_terms() -> None:
    from autoport_cst.errors import PreconditionError
    from autoport_cst.port import _precondition_refusal
    from autoport_cst.spec import ArchSpec, MoESpec

    error = PreconditionError("qwen3_moe/model.py:1019:5: dense-layers: the MoE wrapper takes ...")
    error.realizes = ("moe.dense_layers",)
    spec = ArchSpec(moe=MoESpec(num_experts=4, top_k=2, dense_layers=(0,)))
    refused = _precondition_refusal(
        SimpleNamespace(architecture="HYV3ForCausalLM", spec=spec), [("qwen3_moe", error)]
    )
    assert refused.features == ["moe.dense_layers"]
    first, second = str(refused).splitlines()[:2]
    assert first.endswith("realize dense MLP layers among the MoE layers (layers 0) [moe.dense_layers]")
    assert second.startswith("  from qwen3_moe: qwen3_moe/model.py:1019:5: dense-layers")
