"""module_code: a module's code joined from its top-level statements, each
printed once, is the module's code."""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest
from hypothesis import given
from hypothesis import strategies as st

from autoport_cst.transform.cst import printed as printed_module
from autoport_cst.transform.cst.printed import code_in_order, module_code
from autoport_cst.transform.cst.snippets import parse_statement
from autoport_cst.transform.cst.vocabulary import walk
from autoport_cst.transform.edit.tree import rewrite

SOURCE = textwrap.dedent(
    '''
    # a header comment

    """A module."""
    import torch

    X = 1


    class Attention(nn.Module):
        def __init__(self, config):
            self.scale = config.head_dim**-0.5  # the scale

        def forward(self, q, k):
            scores = q @ k
            return scores * self.scale


    def helper(x):
        if x:
            return x + 1
        return x
    # a footer comment
    '''
).lstrip()


def _names(module: cst.Module) -> list[cst.Name]:
    return [n for n in walk(module) if isinstance(n, cst.Name)]


@pytest.mark.parametrize("reference", ["llama3", "qwen3_moe", "gpt_oss"])
def test_the_code_of_every_reference_file(repo_root, reference):
    for path in sorted((repo_root / "reference_models" / reference).rglob("*.py")):
        module = cst.parse_module(path.read_text())
        assert module_code(module) == module.code == path.read_text(), path


def test_odd_layouts_are_printed_whole():
    for source in ("x = 1", "# only a comment\n", "", "if x:\n\tpass\r\n"):
        module = cst.parse_module(source)
        assert module_code(module) == module.code == source


def test_an_edit_prints_only_the_statement_it_changed(monkeypatch):
    module = cst.parse_module(SOURCE)
    module_code(module)
    scale = next(n for n in _names(module) if n.value == "scale")
    after = rewrite(module, {id(scale): lambda updated: updated.with_changes(value="scaling")})
    expected = after.code
    printed = []
    original = printed_module.node_code

    def counting(module, node):
        printed.append(node)
        return original(module, node)

    # module_code prints a statement it has not kept through node_code
    monkeypatch.setattr(printed_module, "node_code", counting)
    assert module_code(after) == expected
    (edited,) = (s for s in after.body if isinstance(s, cst.ClassDef))
    assert printed == [edited]


EDITS = st.lists(
    st.tuples(
        st.integers(min_value=0, max_value=10_000), st.sampled_from(["same", "other", "gone", "added"])
    ),
    max_size=6,
)


@given(EDITS)
def test_any_edit_agrees_with_printing_the_module(edits):
    module = cst.parse_module(SOURCE)
    names = _names(module)
    statements = [s for s in module.body if isinstance(s, cst.SimpleStatementLine)]
    table = {}
    for index, how in edits:
        name = names[index % len(names)]
        statement = statements[index % len(statements)]
        if how == "same":
            table[id(name)] = lambda updated: cst.Name(updated.value)
        elif how == "other":
            table[id(name)] = lambda updated: updated.with_changes(value=updated.value + "_")
        elif how == "gone":
            table[id(statement)] = lambda updated: cst.RemoveFromParent()
        else:
            table[id(statement)] = lambda updated: cst.FlattenSentinel([updated, parse_statement("Y = 2")])
    after = rewrite(module, table)
    assert module_code(after) == after.code
    assert module_code(module) == module.code


def test_code_in_order_keeps_the_order_of_the_code():
    module = cst.parse_module(SOURCE)
    comments = [n for n in walk(module) if isinstance(n, cst.Comment)]
    code, order = code_in_order(module, {id(c) for c in comments})
    assert code == module.code
    assert [c.value for c in order] == ["# a header comment", "# the scale", "# a footer comment"]
