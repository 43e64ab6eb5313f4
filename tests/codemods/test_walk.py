"""The vocabulary's walks: every node, parents first, in the order of the node
dataclasses' fields, as a walk that asks isinstance of each field value would
list them; a walk pruned where asked; the paths to chosen nodes."""

from __future__ import annotations

import dataclasses

import libcst as cst
import pytest

from autoport_cst.transform.cst.vocabulary import nodes_of, paths_to, walk, walk_pruned


def _children(node: cst.CSTNode) -> list[cst.CSTNode]:
    found: list[cst.CSTNode] = []
    for field in dataclasses.fields(node):
        value = getattr(node, field.name)
        if isinstance(value, cst.CSTNode):
            found.append(value)
        elif isinstance(value, (list, tuple)):
            found.extend(v for v in value if isinstance(v, cst.CSTNode))
    return found


def _walk(node: cst.CSTNode, pruned=lambda node: False) -> list[cst.CSTNode]:
    out, stack = [], [node]
    while stack:
        current = stack.pop()
        out.append(current)
        if not pruned(current):
            stack.extend(reversed(_children(current)))
    return out


def _modules(repo_root, reference):
    for path in sorted((repo_root / "reference_models" / reference).rglob("*.py")):
        yield path, cst.parse_module(path.read_text())


@pytest.mark.parametrize("reference", ["llama3", "qwen3_moe", "gpt_oss"])
def test_walk_lists_every_node_of_a_reference_in_field_order(repo_root, reference):
    for path, module in _modules(repo_root, reference):
        expected = _walk(module)
        found = walk(module)
        assert len(found) == len(expected), path
        assert all(a is b for a, b in zip(found, expected, strict=True)), path
        again = walk(module)  # served from the cache: a list of its own
        assert again is not found and all(a is b for a, b in zip(again, found, strict=True))


def _pruned(node: cst.CSTNode) -> bool:
    return isinstance(node, (cst.FunctionDef, cst.Import, cst.ImportFrom))


def test_a_pruned_walk_skips_what_is_below_the_nodes_it_is_told_to(repo_root):
    for path, module in _modules(repo_root, "llama3"):
        visited: list[cst.CSTNode] = []

        def visit(node: cst.CSTNode, visited=visited) -> bool:
            visited.append(node)
            return not _pruned(node)

        walk_pruned(module, visit)
        expected = _walk(module, _pruned)
        assert len(visited) == len(expected), path
        assert all(a is b for a, b in zip(visited, expected, strict=True)), path


def test_the_paths_to_some_nodes_are_their_ancestors(repo_root):
    path, module = next(_modules(repo_root, "llama3"))
    nodes = walk(module)
    targets = [nodes[i] for i in range(0, len(nodes), 997)]
    parents: dict[int, cst.CSTNode] = {}
    for node in nodes:
        for child in _children(node):
            parents[id(child)] = node
    expected: set[int] = set()
    for target in targets:
        node: cst.CSTNode | None = target
        while node is not None:
            expected.add(id(node))
            node = parents.get(id(node))
    assert paths_to(module, {id(t) for t in targets}) == expected
    assert paths_to(module, set()) == set()


@pytest.mark.parametrize("every", [1, 3, 50, 4000])
def test_the_paths_to_targets_below_each_other_and_side_by_side_are_their_ancestors(repo_root, every):
    """Targets dense or sparse, some below others, the last node among them:
    the paths to them, as the parents of each node give them."""
    for path, module in _modules(repo_root, "qwen3"):
        nodes = walk(module)
        targets = [nodes[i] for i in range(0, len(nodes), every)] + [nodes[-1]]
        parents = {id(child): node for node in nodes for child in _children(node)}
        expected: set[int] = set()
        for target in targets:
            node: cst.CSTNode | None = target
            while node is not None:
                expected.add(id(node))
                node = parents.get(id(node))
        assert paths_to(module, {id(t) for t in targets}) == expected, path
        statement = module.body[-1]
        node = walk(statement)[-1]
        ancestors = set()
        while node is not module:
            ancestors.add(id(node))
            node = parents[id(node)]
        assert paths_to(statement, {id(walk(statement)[-1])}) == ancestors, path


def test_the_nodes_of_some_kinds_are_grouped_by_type_each_in_walk_order(repo_root):
    path, module = next(_modules(repo_root, "llama3"))
    kinds = (cst.Name, cst.BaseString, cst.Comment)
    nodes = walk(module)
    groups: dict[type, list[cst.CSTNode]] = {}
    for node in nodes:
        if isinstance(node, kinds):
            groups.setdefault(type(node), []).append(node)
    expected = [node for group in groups.values() for node in group]
    for _ in range(2):  # the second time from what is kept
        found = nodes_of(module, *kinds)
        assert len(found) == len(expected) and all(a is b for a, b in zip(found, expected, strict=True))
    lambdas = [n for n in nodes if isinstance(n, (cst.Lambda, cst.Yield))]
    assert nodes_of(module, cst.Lambda, cst.Yield) == lambdas


def test_a_walk_after_an_edit_splices_the_statements_walked_before(repo_root):
    """The walk of a module whose one method changed reuses the walks of the
    statements it kept, and lists what a fresh walk lists."""
    for path, module in _modules(repo_root, "llama3"):
        walk(module)
        classes = [s for s in module.body if isinstance(s, cst.ClassDef)]
        if not classes:
            continue
        cls = classes[-1]
        method = next(s for s in cls.body.body if isinstance(s, cst.FunctionDef))
        edited = method.with_changes(
            body=method.body.with_changes(body=[*method.body.body, cst.parse_statement("pass")])
        )
        new_cls = cls.with_changes(body=cls.body.with_changes(body=[edited, *cls.body.body[1:]]))
        new_module = module.with_changes(body=[new_cls if s is cls else s for s in module.body])
        found, expected = walk(new_module), _walk(new_module)
        assert len(found) == len(expected), path
        assert all(a is b for a, b in zip(found, expected, strict=True)), path
        parents = {id(child): node for node in expected for child in _children(node)}
        target: cst.CSTNode | None = edited.body.body[-1]
        ancestors = set()
        while target is not None:
            ancestors.add(id(target))
            target = parents.get(id(target))
        assert paths_to(new_module, {id(edited.body.body[-1])}) == ancestors, path
