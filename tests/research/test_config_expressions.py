"""Constants computed from several config fields, read from the code as
arithmetic a port computes at run time (research/analysis/config_expressions):
the expression read computes what the code computes, on any config values."""

from __future__ import annotations

import ast
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoport_cst.research.analysis.config_expressions import (
    config_expression,
    evaluate,
    fields_of,
    simplified,
)

FIELDS = ("scale_depth", "num_hidden_layers", "hidden_size", "dim_model_base")


def _read(code: str, owners: frozenset[str] = frozenset({"config"})) -> str | None:
    return config_expression(ast.parse(code, mode="eval").body, owners)


def test_minicpm3_residual_multiplier():
    text = _read("config.scale_depth / math.sqrt(config.num_hidden_layers)")
    assert text is not None and simplified(text) == "scale_depth / num_hidden_layers ** 0.5"
    assert fields_of(text) == ["scale_depth", "num_hidden_layers"]
    assert math.isclose(evaluate(text, {"scale_depth": 1.4, "num_hidden_layers": 62}), 1.4 / math.sqrt(62))


def test_a_config_property_reads_self():
    text = _read("self.hidden_size / self.dim_model_base", frozenset({"self"}))
    assert text is not None and simplified(text) == "hidden_size / dim_model_base"
    assert _read("self.config.hidden_size * 2") == "(hidden_size) * (2)"


@pytest.mark.parametrize(
    "code",
    [
        "config.scale_depth / foo(config.num_hidden_layers)",  # an unknown call
        "other.scale_depth * 2",  # a field of another object
        "config.layer_types[0]",  # a subscript
        "2 ** 0.5",  # no config field
        "config.a if config.b else config.c",
        "-config.scale_depth",
    ],
)
def test_other_code_is_not_read(code):
    assert _read(code) is None


def test_a_field_that_is_not_a_number_computes_nothing():
    assert evaluate("scale_depth / num_hidden_layers", {"scale_depth": None, "num_hidden_layers": 2}) is None
    assert evaluate("scale_depth / num_hidden_layers", {"scale_depth": 1.0, "num_hidden_layers": 0}) is None


def _expressions():
    leaves = st.one_of(
        st.sampled_from([f"config.{name}" for name in FIELDS]),
        st.integers(1, 9).map(str),
        st.sampled_from(["0.5", "1.4", "2.0"]),
    )

    def extend(inner):
        return st.one_of(
            st.tuples(inner, st.sampled_from(["+", "-", "*", "/"]), inner).map(
                lambda t: f"({t[0]} {t[1]} {t[2]})"
            ),
            inner.map(lambda e: f"math.sqrt({e})"),
        )

    return st.recursive(leaves, extend, max_leaves=6).filter(lambda code: "config." in code)


@settings(max_examples=60, deadline=None)
@given(code=_expressions(), values=st.tuples(*[st.floats(0.5, 64.0) for _ in FIELDS]))
def test_the_expression_read_computes_what_the_code_computes(code, values):
    config = dict(zip(FIELDS, values, strict=True))

    class Config:
        pass

    namespace = Config()
    namespace.__dict__.update(config)
    try:
        expected = eval(code, {"math": math, "config": namespace})  # noqa: S307 - the test's own expressions
    except (ValueError, ZeroDivisionError):
        return
    text = _read(code)
    assert text is not None, code
    assert set(fields_of(text)) <= set(FIELDS)
    computed = evaluate(simplified(text), config)
    assert computed is not None and math.isclose(computed, expected, rel_tol=1e-9, abs_tol=1e-12), (
        code,
        text,
    )
