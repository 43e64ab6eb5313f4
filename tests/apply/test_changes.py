"""Whether a step changed a file, told from the statements the two modules
share (``apply.changes``): always the answer comparing their whole code gives."""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest
from hypothesis import given
from hypothesis import strategies as st

from autoport_cst.apply.changes import changed_code
from autoport_cst.transform.cst_helpers import parse_statement, rewrite, walk

SOURCE = textwrap.dedent(
    '''
    """A module."""
    import torch

    X = 1


    class Attention(nn.Module):
        def __init__(self, config):
            self.scale = config.head_dim**-0.5

        def forward(self, q, k):
            scores = q @ k
            return scores * self.scale


    def helper(x):
        if x:
            return x + 1
        return x


    class Model(nn.Module):
        def forward(self, x):
            return helper(x)
    '''
).lstrip()


def _agrees(before: cst.Module, after: cst.Module) -> None:
    found = changed_code(before, after)
    assert found is None or found == (before.code != after.code)


def _names(module: cst.Module) -> list[cst.Name]:
    return [n for n in walk(module) if isinstance(n, cst.Name)]


def test_an_edit_inside_a_method_is_a_change():
    module = cst.parse_module(SOURCE)
    scale = next(n for n in _names(module) if n.value == "scale")
    after = rewrite(module, {id(scale): lambda updated: updated.with_changes(value="scaling")})
    assert changed_code(module, after) is True


def test_a_node_rebuilt_as_it_was_is_no_change():
    module = cst.parse_module(SOURCE)
    target = next(n for n in _names(module) if n.value == "helper")
    after = rewrite(module, {id(target): lambda updated: cst.Name("helper")})
    assert after is not module
    assert changed_code(module, after) is False


def test_an_added_statement_is_a_change():
    module = cst.parse_module(SOURCE)
    anchor = module.body[2]
    after = rewrite(
        module, {id(anchor): lambda updated: cst.FlattenSentinel([updated, parse_statement("Y = 2")])}
    )
    assert changed_code(module, after) is True


def test_runs_that_differ_but_print_the_same_code_together_are_no_change():
    """``x = 1`` moved from after a shared statement to before it: each run
    differs, the lengths balance, and the code is the same."""
    x1, x2, x3, y = (parse_statement(code) for code in ("x = 1", "x = 1", "x = 1", "y = 2"))
    shared = parse_statement("x = 1")
    before = cst.Module(body=[x1, shared, x2, y])
    after = cst.Module(body=[x3, parse_statement("x = 1"), shared, parse_statement("y = 2")])
    assert before.code == after.code
    assert changed_code(before, after) is False


def test_another_header_is_left_to_the_whole_code():
    module = cst.parse_module(SOURCE)
    after = module.with_changes(header=[cst.EmptyLine(comment=cst.Comment("# banner"))])
    assert changed_code(module, after) is None


@pytest.mark.parametrize("path", ["llama3/model.py", "qwen3_moe/model.py"])
def test_renaming_one_method_of_a_reference_is_a_change(repo_root, path):
    module = cst.parse_module((repo_root / "reference_models" / path).read_text())
    name = next(n for n in walk(module) if isinstance(n, cst.FunctionDef) and n.name.value == "forward").name
    after = rewrite(module, {id(name): lambda updated: updated.with_changes(value="forward2")})
    assert changed_code(module, after) is True
    back = rewrite(
        after,
        {id(n): lambda u: u.with_changes(value="forward") for n in _names(after) if n.value == "forward2"},
    )
    assert changed_code(after, back) is True
    _agrees(module, back)


EDITS = st.lists(
    st.tuples(
        st.integers(min_value=0, max_value=10_000), st.sampled_from(["same", "other", "longer", "gone"])
    ),
    max_size=6,
)


@given(EDITS)
def test_any_edit_of_names_agrees_with_comparing_the_code(edits):
    module = cst.parse_module(SOURCE)
    names = _names(module)
    table = {}
    for index, how in edits:
        name = names[index % len(names)]
        if how == "same":
            table[id(name)] = lambda updated: cst.Name(updated.value)
        elif how == "other":
            table[id(name)] = lambda updated: updated.with_changes(value=updated.value[::-1] or "z")
        elif how == "longer":
            table[id(name)] = lambda updated: updated.with_changes(value=updated.value + "_")
    statements = [s for s in module.body if isinstance(s, cst.SimpleStatementLine)]
    gone = {id(statements[i % len(statements)]) for i, how in edits if how == "gone"}
    for key in gone:
        table[key] = lambda updated: cst.RemoveFromParent()
    _agrees(module, rewrite(module, table))
