"""Proofs of equivalence the normaliser does not make (benchmarks/mutation.py).

``identity_mapping(code, line, readers)``: the statement removed at ``line``
is ``D[K] = K`` (a parameter mapped to the checkpoint key of its own name) in
a function where ``D`` is a dict that is only filled and handed to checkpoint
readers which take a parameter's keys as ``mappings.get(name, name)``
(``readers``: the stand-in's ``vllm_neuron.utils.checkpoints`` methods with a
``mappings`` parameter). Removing such an entry changes nothing when no other
entry of ``D`` can have the same key on the same run:

- ``K`` is a string, or an f-string of locals that hold strings or the
  integers of a ``range`` loop (evaluating it has no side effect);
- ``D`` is bound once, to ``{}``; every other use of it is ``D[...] = ...`` or
  an argument of a reader call;
- every other store ``D[K2] = ...`` has a key that provably differs from
  ``K`` (string literals: their leading or trailing literal texts, neither a
  prefix / suffix of the other), or sits in the other branch of an ``if``
  that holds both stores and that no loop of the function encloses.

Anything else is not proved (the mutant is validated).
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterable


def identity_mapping(code: str, line: int, readers: Iterable[str]) -> str | None:
    """Why removing the statement at ``line`` of ``code`` is equivalent, or None."""
    tree, parents = _parsed(code)
    store = next((n for n in ast.walk(tree) if isinstance(n, ast.Assign) and n.lineno == line), None)
    if store is None or not _is_identity_store(store):
        return None
    target = store.targets[0]
    assert isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name)
    function = _enclosing_function(store, parents)
    if function is None or not _pure_key(target.slice, function):
        return None
    name = target.value.id
    if not _only_filled_and_read(function, name, set(readers), parents):
        return None
    for other in _stores(function, name):
        if other is not store and not _distinct(target.slice, other, store, function, parents):
            return None
    return f"{name}[key] = key: the checkpoint readers take {name}.get(name, name)"


@functools.lru_cache(maxsize=8)
def _parsed(code: str) -> tuple[ast.Module, dict[ast.AST, ast.AST]]:
    """The module's tree and each node's parent (one parse per port)."""
    tree = ast.parse(code)
    return tree, {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


def _is_identity_store(node: ast.Assign) -> bool:
    if len(node.targets) != 1 or not isinstance(node.targets[0], ast.Subscript):
        return False
    target = node.targets[0]
    return isinstance(target.value, ast.Name) and ast.dump(target.slice) == ast.dump(node.value)


def _enclosing_function(node: ast.AST, parents: dict) -> ast.FunctionDef | None:
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            return node  # type: ignore[return-value]
    return None


def _pure_key(key: ast.expr, function: ast.FunctionDef, seen: frozenset[str] = frozenset()) -> bool:
    """A string constant, or an f-string of locals bound only to such strings or to a range loop."""
    if isinstance(key, ast.Constant):
        return isinstance(key.value, str)
    if not isinstance(key, ast.JoinedStr):
        return False
    for part in key.values:
        if isinstance(part, ast.FormattedValue):
            if part.conversion != -1 or part.format_spec is not None or not isinstance(part.value, ast.Name):
                return False
            if not _plain_local(part.value.id, function, seen):
                return False
    return True


def _plain_local(name: str, function: ast.FunctionDef, seen: frozenset[str]) -> bool:
    """Whether every binding of ``name`` in the function is ``name = <pure key>``
    or ``for name in range(...)`` (and there is one)."""
    if name in seen or _declared_outside(function, name):
        return False
    bindings = _bindings(function, name)
    for node in bindings:
        if isinstance(node, ast.For):
            call = node.iter
            if not (
                isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "range"
            ):
                return False
        elif not (isinstance(node, ast.Assign) and _pure_key(node.value, function, seen | {name})):
            return False
    return bool(bindings)


def _bindings(function: ast.FunctionDef, name: str) -> list[ast.AST]:
    """The statements binding ``name``: ``name = ...`` and ``for name in ...``
    as themselves, any other binding (a parameter, a tuple target, ``with``,
    augmented, a comprehension) as the node that binds it."""
    parents = {child: node for node in ast.walk(function) for child in ast.iter_child_nodes(node)}
    found: list[ast.AST] = [a for a in ast.walk(function.args) if isinstance(a, ast.arg) and a.arg == name]
    for node in ast.walk(function):
        if isinstance(node, ast.Name) and node.id == name and isinstance(node.ctx, ast.Store | ast.Del):
            parent = parents[node]
            plain_for = isinstance(parent, ast.For) and parent.target is node
            plain_assign = isinstance(parent, ast.Assign) and parent.targets == [node]
            found.append(parent if plain_for or plain_assign else node)
    return found


def _declared_outside(function: ast.FunctionDef, name: str) -> bool:
    return any(isinstance(n, ast.Global | ast.Nonlocal) and name in n.names for n in ast.walk(function))


def _only_filled_and_read(function: ast.FunctionDef, name: str, readers: set[str], parents: dict) -> bool:
    """``name`` is bound once, to ``{}``, and otherwise only filled or passed to a reader."""
    bound = _bindings(function, name)
    if _declared_outside(function, name) or len(bound) != 1 or not isinstance(bound[0], ast.Assign):
        return False
    value = bound[0].value
    if not (isinstance(value, ast.Dict) and not value.keys):
        return False
    for node in ast.walk(function):
        if not (isinstance(node, ast.Name) and node.id == name) or isinstance(node.ctx, ast.Store):
            continue
        parent = parents[node]
        filled = (
            isinstance(parent, ast.Subscript) and isinstance(parent.ctx, ast.Store) and parent.value is node
        )
        if filled and isinstance(parents.get(parent), ast.Assign):
            continue
        if parent is not None and _reader_argument(node, parent, parents, readers):
            continue
        return False
    return True


def _reader_argument(node: ast.Name, parent: ast.AST, parents: dict, readers: set[str]) -> bool:
    call = parents.get(parent) if isinstance(parent, ast.keyword) else parent
    if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Attribute):
        return False
    passed = node in call.args or (isinstance(parent, ast.keyword) and parent.value is node)
    return passed and call.func.attr in readers


def _stores(function: ast.FunctionDef, name: str) -> list[ast.Assign]:
    return [
        n
        for n in ast.walk(function)
        if isinstance(n, ast.Assign)
        and any(
            isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name) and t.value.id == name
            for t in n.targets
        )
    ]


def _distinct(key: ast.expr, other: ast.Assign, store: ast.Assign, function: ast.AST, parents: dict) -> bool:
    if len(other.targets) != 1:
        return False
    other_key = other.targets[0].slice  # type: ignore[attr-defined]
    if _literal_texts_differ(key, other_key):
        return True
    return _exclusive_branches(store, other, function, parents)


def _literal_texts_differ(a: ast.expr, b: ast.expr) -> bool:
    """Two string keys that cannot be equal: their leading (or trailing)
    literal texts, neither a prefix (suffix) of the other."""
    ends = [_literal_ends(a), _literal_ends(b)]
    if None in ends:
        return False
    (head_a, tail_a), (head_b, tail_b) = ends  # type: ignore[misc]
    heads_differ = not (head_a.startswith(head_b) or head_b.startswith(head_a))
    tails_differ = not (tail_a.endswith(tail_b) or tail_b.endswith(tail_a))
    return heads_differ or tails_differ


def _literal_ends(key: ast.expr) -> tuple[str, str] | None:
    if isinstance(key, ast.Constant) and isinstance(key.value, str):
        return key.value, key.value
    if not isinstance(key, ast.JoinedStr) or not key.values:
        return None
    first, last = key.values[0], key.values[-1]
    head = first.value if isinstance(first, ast.Constant) else ""
    tail = last.value if isinstance(last, ast.Constant) else ""
    return str(head), str(tail)


def _exclusive_branches(a: ast.AST, b: ast.AST, function: ast.AST, parents: dict) -> bool:
    """Whether ``a`` and ``b`` sit in the two branches of one ``if`` that no loop of the function encloses."""
    chain_a = _ancestors(a, function, parents)
    for node in _ancestors(b, function, parents):
        if isinstance(node, ast.If) and node in chain_a:
            in_body = [any(_inside(x, s) for s in node.body) for x in (a, b)]
            in_else = [any(_inside(x, s) for s in node.orelse) for x in (a, b)]
            enclosing = _ancestors(node, function, parents)
            looped = any(isinstance(n, ast.For | ast.While | ast.AsyncFor) for n in enclosing)
            return not looped and ((in_body[0] and in_else[1]) or (in_else[0] and in_body[1]))
    return False


def _ancestors(node: ast.AST, function: ast.AST, parents: dict) -> list[ast.AST]:
    found = []
    while node is not function and node in parents:
        node = parents[node]
        found.append(node)
    return found


def _inside(node: ast.AST, root: ast.AST) -> bool:
    return any(n is node for n in ast.walk(root))
