"""What a refusal names: the fields that block the reference the choice calls
closest, so the message and the named features agree."""

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
    assert "no codemod realizes norm.kind" in str(error)


def test_unsupported_computations_are_named_one_by_one() -> None:
    closest = _candidate("ref", ("unsupported",), extra_fields=0)
    choice = ReferenceChoice("ref", False, (closest,), "closest: ref")
    spec = SimpleNamespace(unsupported=["mamba_mixer: modeling_x.py:12 selective scan", "cross_attention"])
    error = refusal(SimpleNamespace(architecture="XForCausalLM", spec=spec), choice)
    assert error.features == ["mamba_mixer", "cross_attention"]
    assert "mamba_mixer: modeling_x.py:12 selective scan" in str(error)


def test_a_realizable_choice_is_not_refused() -> None:
    choice = ReferenceChoice("ref", True, (Candidate("ref", True, (), (), ()),), "ref: realizable")
    assert refusal(SimpleNamespace(architecture="X", spec=SimpleNamespace(unsupported=[])), choice) is None
