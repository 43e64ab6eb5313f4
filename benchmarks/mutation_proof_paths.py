"""A removed store no path reads: ``dead_store`` (benchmarks/mutation.py).

``dead_store(code, line, elsewhere)``: the statement removed at ``line`` is
``a = b = <constant>`` (names bound to a constant: evaluating it has no effect)
in the ``then`` branch of an ``if T:`` of a function ``F``. Removing it leaves
those names unbound on that path instead of bound to the constant, which
changes nothing when no read of them can run after it on that path:

- no loop, ``try`` or ``with`` encloses the store in ``F`` (no second pass, no
  handler, no suppressed exception), ``F`` declares none of the names
  ``global``/``nonlocal``, deletes none, calls no ``locals``, ``vars``,
  ``eval`` or ``exec``, and no function, lambda or class nested in ``F``
  names them;
- no statement after the store in its branch names them;
- every read after the ``if`` sits in the body of a later ``if`` whose test
  contradicts a conjunct of ``T`` (``x <= c`` and ``x > c``, ``a is None`` and
  ``a is not None``, ``x`` and ``not x``; an order or equality only against a
  literal), or in the ``else`` of a later ``if`` whose test is a conjunct of
  ``T``; reads before the ``if`` or in its ``else`` run before it or instead
  of it.

A conjunct counts only when re-evaluating it gives the same value: its locals
are bound only before the ``if``, and its ``self.X`` attributes are stored
only in ``__init__`` methods of the module, never named as a string there, and
never stored by the package's other files or the stand-in (``elsewhere``).
The premises: truth values and comparisons of the same objects are
deterministic, and an order or equality against a literal (numbers, strings,
``None``) has its complement (true of Python's numbers, strings and tensors of
one element). Anything else is not proved.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable

_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
_BARRIERS = (ast.For, ast.AsyncFor, ast.While, ast.Try, ast.With, ast.AsyncWith)
_COMPLEMENTS = {
    ast.Lt: ast.GtE,
    ast.GtE: ast.Lt,
    ast.LtE: ast.Gt,
    ast.Gt: ast.LtE,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
}
_REFLECTIVE = {"locals", "vars", "eval", "exec"}


def dead_store(code: str, line: int, elsewhere: Iterable[str]) -> str | None:
    """Why removing the statement at ``line`` of ``code`` is equivalent, or None."""
    tree = ast.parse(code)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    store = next((n for n in ast.walk(tree) if isinstance(n, ast.Assign) and n.lineno == line), None)
    if store is None or not isinstance(store.value, ast.Constant):
        return None
    if not all(isinstance(t, ast.Name) for t in store.targets):
        return None
    names = {t.id for t in store.targets if isinstance(t, ast.Name)}
    branch = parents.get(store)
    function = _function_of(branch, parents)
    if not isinstance(branch, ast.If) or store not in branch.body or function is None:
        return None
    if not _plain_scope(function, names, store, parents):
        return None
    after = branch.body[branch.body.index(store) + 1 :]
    if any(_mentions(s, names) for s in after):
        return None
    facts = [f for f in _conjuncts(branch.test) if _stable(f, function, branch, tree, elsewhere)]
    for read in _reads(function, names):
        if read.lineno > branch.end_lineno and not _unreachable(read, facts, branch, function, parents):
            return None
    shown = " = ".join(sorted(names))
    return f"{shown} = constant: no read of it can run after this branch of `if {ast.unparse(branch.test)}`"


def _function_of(node: ast.AST | None, parents: dict) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    """The function whose body holds ``node`` through ``if`` statements only."""
    while node is not None and not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        if isinstance(node, (*_BARRIERS, ast.Lambda, ast.ClassDef, ast.Module)):
            return None
        node = parents.get(node)
    return node


def _plain_scope(function: ast.AST, names: set[str], store: ast.AST, parents: dict) -> bool:
    for node in ast.walk(function):
        if isinstance(node, (ast.Global, ast.Nonlocal)) and names & set(node.names):
            return False
        if isinstance(node, ast.Delete) and _mentions(node, names):
            return False
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _REFLECTIVE:
            return False
        if node is not function and isinstance(node, _SCOPES) and _mentions(node, names):
            return False
    return True


def _mentions(node: ast.AST, names: set[str]) -> bool:
    return any(isinstance(n, ast.Name) and n.id in names for n in ast.walk(node))


def _reads(function: ast.AST, names: set[str]) -> list[ast.Name]:
    """Loads of the names, and the targets of ``name += ...`` (which read it)."""
    augmented = {id(n.target) for n in ast.walk(function) if isinstance(n, ast.AugAssign)}
    return [
        n
        for n in ast.walk(function)
        if isinstance(n, ast.Name) and n.id in names and (isinstance(n.ctx, ast.Load) or id(n) in augmented)
    ]


def _conjuncts(test: ast.expr) -> list[ast.expr]:
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        return [c for value in test.values for c in _conjuncts(value)]
    return [test]


def _stable(
    fact: ast.expr, function: ast.AST, branch: ast.If, tree: ast.Module, elsewhere: Iterable[str]
) -> bool:
    """Whether ``fact`` has the same value wherever it is evaluated after ``branch``'s test."""
    this = function.args.args[0].arg if function.args.args else None
    if this is not None and not _local_bound_before(function, this, branch):
        this = None  # ``self`` bound again after the test: no attribute of it is a fact
    for node in ast.walk(fact):
        if isinstance(node, ast.Attribute):
            if not (isinstance(node.value, ast.Name) and node.value.id == this):
                return False
            if not _set_in_init_only(node.attr, tree, elsewhere):
                return False
        elif isinstance(node, ast.Name):
            if node.id != this and not _local_bound_before(function, node.id, branch):
                return False
        elif not isinstance(
            node, (ast.Compare, ast.UnaryOp, ast.Constant, ast.expr_context, ast.cmpop, ast.Not)
        ):
            return False
    return True


def _local_bound_before(function: ast.AST, name: str, branch: ast.If) -> bool:
    """Whether ``name`` is a local of ``function`` (a parameter, or bound in its
    body) bound only before ``branch``, and declared ``global``/``nonlocal`` nowhere
    in it (a nested function could rebind it when called later)."""
    parameters = {a.arg for a in ast.walk(function.args) if isinstance(a, ast.arg)}
    bindings = []
    for node in ast.walk(function):
        if isinstance(node, (ast.Global, ast.Nonlocal)) and name in node.names:
            return False
        if isinstance(node, ast.Name) and node.id == name and not isinstance(node.ctx, ast.Load):
            bindings.append(node)
    if not bindings and name not in parameters:
        return False  # a global: any call could store it
    return all(b.lineno < branch.lineno for b in bindings)


def _set_in_init_only(attribute: str, tree: ast.Module, elsewhere: Iterable[str]) -> bool:
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and node.value == attribute:
            return False  # setattr(obj, "attribute", ...) or the like
        if isinstance(node, ast.Attribute) and node.attr == attribute and not isinstance(node.ctx, ast.Load):
            scope = node
            while scope is not None and not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
                scope = parents.get(scope)
            if scope is None or scope.name != "__init__":
                return False
    return not stored_elsewhere(attribute, elsewhere)


def stored_elsewhere(attribute: str, elsewhere: Iterable[str]) -> bool:
    """Whether a text of ``elsewhere`` stores ``.attribute`` (plainly or
    augmented) or names it as a string."""
    stored = re.compile(
        rf"\.{re.escape(attribute)}\s*(?:[-+*/%&|^@]|//|\*\*|<<|>>)?=(?!=)|[\"']{re.escape(attribute)}[\"']"
    )
    return any(stored.search(text) for text in elsewhere)


def _unreachable(
    read: ast.AST, facts: list[ast.expr], branch: ast.If, function: ast.AST, parents: dict
) -> bool:
    """Whether ``read`` sits under a later ``if`` the facts rule out."""
    child, node = read, parents.get(read)
    while node is not None and node is not function:
        if isinstance(node, ast.If) and node.lineno > branch.end_lineno:
            if child in node.body and _contradicted(node.test, facts):
                return True
            if child in node.orelse and _implied(node.test, facts):
                return True
        child, node = node, parents.get(node)
    return False


def _implied(test: ast.expr, facts: list[ast.expr]) -> bool:
    if isinstance(test, ast.BoolOp):
        parts = [_implied(v, facts) for v in test.values]
        return all(parts) if isinstance(test.op, ast.And) else any(parts)
    return any(ast.dump(test) == ast.dump(f) for f in facts)


def _contradicted(test: ast.expr, facts: list[ast.expr]) -> bool:
    if isinstance(test, ast.BoolOp):
        parts = [_contradicted(v, facts) for v in test.values]
        return any(parts) if isinstance(test.op, ast.And) else all(parts)
    return any(_opposite(test, f) or _opposite(f, test) for f in facts)


def _opposite(a: ast.expr, b: ast.expr) -> bool:
    """Whether ``a`` true makes ``b`` false."""
    if isinstance(a, ast.UnaryOp) and isinstance(a.op, ast.Not):
        return ast.dump(a.operand) == ast.dump(b)
    if not (isinstance(a, ast.Compare) and isinstance(b, ast.Compare)):
        return False
    if len(a.ops) != 1 or len(b.ops) != 1 or _COMPLEMENTS.get(type(a.ops[0])) is not type(b.ops[0]):
        return False
    same = ast.dump(a.left) == ast.dump(b.left) and ast.dump(a.comparators[0]) == ast.dump(b.comparators[0])
    literal = isinstance(a.comparators[0], ast.Constant) or isinstance(a.left, ast.Constant)
    return same and (literal or isinstance(a.ops[0], (ast.Is, ast.IsNot)))
