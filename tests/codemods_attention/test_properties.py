"""Properties of the attention and RoPE codemods on real model files
(``model_variants``): each one transforms its target or refuses it with a
precondition error that names the codemod and the file; its output compiles
and is a fixed point; and codemods with no ordering constraint between them
commute, byte for byte.

The fast run checks every independent pair once on the llama3 file and a few
random variants per property; ``--run-slow`` explores many more variants.
"""

from __future__ import annotations

import itertools
from functools import cache

import libcst as cst
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoport_cst.errors import PreconditionError
from autoport_cst.transform.library import get_codemod

from .model_variants import (
    PARAMS,
    Variant,
    apply,
    variant_source,
    variants,
)

FAST = settings(max_examples=2, deadline=None, suppress_health_check=[HealthCheck.too_slow])
THOROUGH = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
IDS = sorted(PARAMS)


def checked(output: str) -> str:
    cst.parse_module(output)
    compile(output, "model.py", "exec")
    return output


def transformed_or_refused(codemod_id: str, params: dict, source: str) -> str | None:
    try:
        output = checked(apply(codemod_id, params, source))
    except PreconditionError as error:
        assert error.position is not None and error.position.path == "model.py"
        assert str(error).startswith("model.py") and codemod_id in str(error)
        return None
    assert output != source or _already_there(codemod_id, source)
    return output


def _already_there(codemod_id: str, source: str) -> bool:
    """The qwen3 and smollm3 references already have some of these features."""
    markers = {
        "qk-norm": "self.q_norm",
        "sliding-window": "self.sliding_window",
        "nope-layers": "self.use_rope",
        "rope-scaling": '"yarn"',
    }
    return markers.get(codemod_id, "\0") in source


def _idempotent(codemod_id: str, params: dict, source: str) -> None:
    once = transformed_or_refused(codemod_id, params, source)
    if once is not None:
        assert apply(codemod_id, params, once) == once


@pytest.mark.parametrize("codemod_id", IDS)
@FAST
@given(data=st.data(), variant=variants)
def test_idempotent_and_compiles(codemod_id, data, variant):
    _idempotent(codemod_id, data.draw(PARAMS[codemod_id]), variant_source(variant))


@pytest.mark.slow
@pytest.mark.parametrize("codemod_id", IDS)
@THOROUGH
@given(data=st.data(), variant=variants)
def test_idempotent_and_compiles_thoroughly(codemod_id, data, variant):
    _idempotent(codemod_id, data.draw(PARAMS[codemod_id]), variant_source(variant))


def _independent_pairs():
    for a, b in itertools.combinations(IDS, 2):
        if a not in get_codemod(b).AFTER and b not in get_codemod(a).AFTER:
            yield a, b


def _commute(first: str, p1: dict, second: str, p2: dict, source: str) -> None:
    try:
        ab = apply(second, p2, apply(first, p1, source))
        ba = apply(first, p1, apply(second, p2, source))
    except PreconditionError:
        return
    assert ab == ba


@cache
def _on_llama3(codemod_id: str) -> str | PreconditionError:
    """``codemod_id`` applied once to the llama3 file, or its refusal: shared
    by the pairs the codemod is in (each applied it again, twice per pair)."""
    try:
        return apply(codemod_id, {}, variant_source(Variant()))
    except PreconditionError as error:
        return error


@pytest.mark.parametrize("first, second", list(_independent_pairs()))
def test_independent_codemods_commute_on_llama3(first, second):
    """As ``_commute`` on the llama3 file, each codemod's own application
    computed once (``_on_llama3``)."""
    once_first, once_second = _on_llama3(first), _on_llama3(second)
    if isinstance(once_first, PreconditionError) or isinstance(once_second, PreconditionError):
        return
    try:
        ab = apply(second, {}, once_first)
        ba = apply(first, {}, once_second)
    except PreconditionError:
        return
    assert ab == ba


@pytest.mark.slow
@pytest.mark.parametrize("first, second", list(_independent_pairs()))
@THOROUGH
@given(data=st.data(), variant=variants)
def test_independent_codemods_commute(first, second, data, variant):
    _commute(first, data.draw(PARAMS[first]), second, data.draw(PARAMS[second]), variant_source(variant))


def test_the_ordered_pairs_are_declared():
    pairs = set(_independent_pairs())
    assert ("partial-rotary", "rope-scaling") not in pairs
    assert ("attention-softcap", "qk-norm") not in pairs
    assert ("interleaved-rope", "partial-rotary") in pairs


def _in_after_order(ids: list[str]) -> list[str]:
    """``ids`` in an order their AFTER constraints allow (by ID among the free)."""
    order: list[str] = []
    while len(order) < len(ids):
        order.append(
            next(
                i
                for i in ids
                if i not in order and all(a in order or a not in ids for a in get_codemod(i).AFTER)
            )
        )
    return order


# Codemods left out of the composition of all, each the alternative of one in
# it (a model has one or the other); their own port tests compose them with
# the rest of a model's codemods.
ALTERNATIVES = {
    # removes RoPE, which the RoPE codemods edit (tests/coverage_dense/test_learned_positions.py)
    "learned-positions",
    # removes RoPE too, ALiBi instead (tests/coverage_dense/test_mpt.py)
    "alibi-positions",
    # a layer slides or attends in chunks, and a sink per batch row cannot be
    # repeated over the folded chunks: refuses beside sliding-window and
    # attention-sinks (tests/coverage_moe/test_llama4_port.py)
    "chunked-attention",
    # q/k norms with no weight, the alternative of qk-norm's learned ones
    # (tests/coverage_moe/test_llama4_port.py)
    "weightless-qk-norm",
    # removes RoPE too, a table of sines and cosines instead (tests/coverage_dense/test_xglm.py)
    "sinusoidal-positions",
    # the halves of a whole head turned the other way, the alternative of interleaved-rope's and
    # partial-rotary's pairs: refuses beside them (tests/coverage_dense/test_nanochat.py)
    "swapped-halves-rope",
}


@pytest.mark.parametrize("qk_norm", ["full_width", "per_head"])
def test_all_codemods_compose_on_llama3(qk_norm):
    """Every codemod, applied one after the other (in an order their AFTER
    constraints allow), gives a file that compiles, where each is a fixed
    point; with full-width q/k norms, the harder case for the others (so
    without qk-norm-position, which moves per-head norms after RoPE), and
    with per-head ones moved after RoPE (qk-norm then finds its norms there).
    Without learned-positions: it removes RoPE, which the RoPE codemods edit
    (a model has one or the other; its own tests compose it with the rest of
    a GPT-2 port, tests/coverage_dense/test_learned_positions.py); without
    the other ``ALTERNATIVES``, each the alternative of a codemod in the run."""
    ids = [i for i in IDS if (qk_norm == "per_head" or i != "qk-norm-position") and i not in ALTERNATIVES]
    order = _in_after_order(ids)
    params = {codemod_id: {} for codemod_id in order} | {"qk-norm": {"kind": qk_norm}}
    source = variant_source(Variant())
    for codemod_id in order:
        source = checked(apply(codemod_id, params[codemod_id], source))
    for codemod_id in order:
        assert apply(codemod_id, params[codemod_id], source) == source, codemod_id
