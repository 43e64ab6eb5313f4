"""vocabulary.walk and child_nodes: every node, parents first, in the
order of the node dataclasses' fields, as a walk that asks isinstance of
each field value would list them."""

from __future__ import annotations

import dataclasses

import libcst as cst
import pytest

from autoport_cst.transform.vocabulary import child_nodes, walk


def _children(node: cst.CSTNode) -> list[cst.CSTNode]:
    found: list[cst.CSTNode] = []
    for field in dataclasses.fields(node):
        value = getattr(node, field.name)
        if isinstance(value, cst.CSTNode):
            found.append(value)
        elif isinstance(value, (list, tuple)):
            found.extend(v for v in value if isinstance(v, cst.CSTNode))
    return found


def _walk(node: cst.CSTNode) -> list[cst.CSTNode]:
    out, stack = [], [node]
    while stack:
        current = stack.pop()
        out.append(current)
        stack.extend(reversed(_children(current)))
    return out


@pytest.mark.parametrize("reference", ["llama3", "qwen3_moe", "gpt_oss"])
def test_walk_lists_every_node_of_a_reference_in_field_order(repo_root, reference):
    for path in sorted((repo_root / "reference_models" / reference).rglob("*.py")):
        module = cst.parse_module(path.read_text())
        expected = _walk(module)
        found = walk(module)
        assert len(found) == len(expected) and all(a is b for a, b in zip(found, expected, strict=True)), path
        assert walk(module) == found and walk(module) is not found  # served again, a list of its own
        for node in expected[:2000]:
            assert child_nodes(node) == _children(node)
