"""Properties of the codemod library over generated model-shaped sources.

- idempotence: T(T(x)) == T(x), byte for byte;
- a codemod either transforms its target or raises a clear precondition
  error; code it does not target comes back unchanged or is refused;
- every output parses and compiles;
- codemods with no ordering constraint between them commute.

Examples per property: 25 by default; set HYPOTHESIS_PROFILE=thorough for
many more (an opt-in, slower run).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Mapping

import libcst as cst
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoport_cst.errors import PreconditionError
from autoport_cst.transform.base import Codemod, PortContext, run_on_source
from autoport_cst.transform.library import get_codemod, library

from .model_sources import PREFIX, model_sources, unrelated_sources
from .param_strategies import params_strategy

# profiles: tests/conftest.py


def generic_params(codemods: Mapping[str, type[Codemod]]) -> dict[str, st.SearchStrategy[dict]]:
    """The codemods that transform model files and act on generated sources,
    with strategies derived from their parameters (param_strategies.py);
    rename-classes renames from the generated source's prefix, which the test
    supplies."""
    found = {
        codemod_id: params_strategy(cls)
        for codemod_id, cls in codemods.items()
        if "model" in cls.FILES and not cls.NEEDS_REAL_MODEL
    }
    if "rename-classes" in found:
        found["rename-classes"] = PREFIX.map(lambda p: {"new_prefix": p + "X"})
    return found


PARAMS = generic_params(library())


def apply(codemod_id: str, params: dict, source: str, old_prefix: str) -> str:
    cls = get_codemod(codemod_id)
    if codemod_id == "rename-classes":
        params = {"old_prefix": old_prefix, **params}
    codemod: Codemod = cls(cls.parse_params(params))
    return run_on_source(codemod, source, "model.py", "model", PortContext())[0]


def checked(output: str) -> str:
    cst.parse_module(output)
    compile(output, "model.py", "exec")
    return output


@pytest.mark.parametrize("codemod_id", sorted(PARAMS))
@given(data=st.data(), generated=model_sources)
def test_idempotent_and_compiles(codemod_id, data, generated):
    shape, source = generated
    params = data.draw(PARAMS[codemod_id])
    try:
        once = checked(apply(codemod_id, params, source, shape.prefix))
    except PreconditionError as error:
        assert error.position is not None and error.position.path == "model.py"
        assert codemod_id in str(error)
        return
    old = shape.prefix
    if codemod_id == "rename-classes":  # the second run renames from the new prefix
        old = params["new_prefix"]
    assert apply(codemod_id, params, once, old) == once


@pytest.mark.parametrize("codemod_id", sorted(PARAMS))
@given(data=st.data(), source=unrelated_sources())
def test_untargeted_code_is_unchanged_or_refused(codemod_id, data, source):
    params = data.draw(PARAMS[codemod_id])
    try:
        output = apply(codemod_id, params, source, "Llama")
    except PreconditionError as error:
        assert "model.py" in str(error)
        return
    assert output == source


def _independent_pairs():
    ids = sorted(PARAMS)
    for a, b in itertools.combinations(ids, 2):
        ca, cb = get_codemod(a), get_codemod(b)
        if a not in cb.AFTER and b not in ca.AFTER:
            yield a, b


PAIRS = sorted(_independent_pairs())
COMMUTE_EXAMPLES = 150 if os.environ.get("HYPOTHESIS_PROFILE", "default") == "default" else 4000


@settings(max_examples=COMMUTE_EXAMPLES)
@given(data=st.data(), pair=st.sampled_from(PAIRS), generated=model_sources)
def test_independent_codemods_commute(data, pair, generated):
    """Pairs are drawn from every independent pair (the number of pairs grows
    with the square of the library, so they share one example budget)."""
    first, second = pair
    shape, source = generated
    p1, p2 = data.draw(PARAMS[first]), data.draw(PARAMS[second])

    def run(order):
        text, prefix = source, shape.prefix
        for codemod_id, params in order:
            text = apply(codemod_id, params, text, prefix)
            if codemod_id == "rename-classes":
                prefix = params["new_prefix"]
        return text

    try:
        ab = run([(first, p1), (second, p2)])
        ba = run([(second, p2), (first, p1)])
    except PreconditionError:
        return
    assert ab == ba, f"{first} and {second} do not commute"


def test_independent_pairs_are_declared():
    pairs = set(_independent_pairs())
    assert ("add-qkv-bias", "unsqueeze-decode-biases") not in pairs
    assert ("rename-classes", "swap-norm") in pairs
