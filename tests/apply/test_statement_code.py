"""The code of nodes with the kept code of statements spliced in
(``transform.statement_code``) is LibCST's code of the same nodes: for every
statement and class of the references, printed alone (at no indentation) and
then inside what holds it, and after an edit that keeps most statements."""

from __future__ import annotations

import libcst as cst
import pytest

from autoport_cst.transform.cst.printed import module_code
from autoport_cst.transform.cst.statement_code import node_code
from autoport_cst.transform.cst.vocabulary import walk


def _modules(repo_root, reference):
    for path in sorted((repo_root / "reference_models" / reference).rglob("*.py")):
        yield path, cst.parse_module(path.read_text())


@pytest.mark.parametrize("reference", ["llama3", "qwen3_moe", "gpt_oss"])
def test_statements_print_as_libcst_prints_them_wherever_they_stand(repo_root, reference):
    for path, module in _modules(repo_root, reference):
        statements = [n for n in walk(module) if isinstance(n, cst.BaseStatement)]
        for node in reversed(statements):  # the innermost first: each is spliced into what holds it
            assert node_code(module, node) == module.code_for_node(node), path
        assert module_code(module) == module.code, path


def test_an_edited_class_prints_its_kept_statements_at_their_new_indentation():
    module = cst.parse_module(
        "class A:\n"
        "    def f(self, x):\n"
        "        if x:\n"
        "            y = 1  # one\n"
        "        elif x > 2:\n"
        "            y = 2\n"
        "        else:\n"
        "\n"
        "            y = 3\n"
        "        return y\n"
    )
    cls = module.body[0]
    method = cls.body.body[0]
    for node in walk(method):  # printed alone first: the method at no indentation
        if isinstance(node, cst.BaseStatement):
            assert node_code(module, node) == module.code_for_node(node)
    assert node_code(module, cls) == module.code_for_node(cls)
    # the method moved into an ``if`` of a new method (deeper), next to a new statement
    outer = cst.parse_statement("def g(self):\n    if True:\n        pass\n")
    nested = outer.with_changes(
        body=outer.body.with_changes(
            body=[outer.body.body[0].with_changes(body=outer.body.body[0].body.with_changes(body=[method]))]
        )
    )
    edited = cls.with_changes(body=cls.body.with_changes(body=[nested, method]))
    new = module.with_changes(body=[edited])
    assert node_code(new, edited) == new.code_for_node(edited)
    assert module_code(new) == new.code
    tabs = new.with_changes(default_indent="\t")  # another layout: printed, not spliced
    assert node_code(tabs, edited) == tabs.code_for_node(edited)


def test_parenthesized_expressions_print_as_libcst_prints_them_and_positions_stay_libcsts():
    """A ``SplicingState`` writes an expression's parentheses without LibCST's
    generator context (it records no positions); LibCST's own states, which
    do, still place an expression inside its parentheses."""
    from libcst.metadata import MetadataWrapper, PositionProvider

    source = "x = ((a + b) * (c))\ny = f(((d)), [(e)], -(g))\n"
    module = cst.parse_module(source)
    assert node_code(module, module) == source
    product = module.body[0].body[0].value  # type: ignore[attr-defined]
    position = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)[product]
    assert (position.start.line, position.start.column, position.end.column) == (1, 5, 18)
