"""A conditional attribute's alternative no read takes: ``unread_alternative`` (benchmarks/mutation.py).

``unread_alternative(code, mutated, line, elsewhere)``: the statement at
``line`` is ``self.A = X if C else K``, directly in the body of a method
``__init__`` of a module-level class ``D``, and the mutant changes nothing but
the constant ``K`` (into another constant). The two differ only when ``C`` is
false at the store, in the value of ``A``; that changes nothing when every
read of ``A`` runs only where ``C`` is true:

- every ``.A`` of the module other than the store is a load ``self.A`` in a
  method of ``D`` (``self`` its first parameter, never bound again in it), in
  the body (not the ``else``) of an ``if`` of that method whose test has ``C``
  as a conjunct (the same expression, ``self`` named alike), with no function,
  lambda or class between the read and that ``if``; no class of the module
  names ``D`` among its bases; no string of the module is ``"A"``, the module
  reads no ``__dict__``, calls no ``vars`` and names attributes (``getattr``,
  ``setattr``, ...) only by string literals or by a ``for`` loop's variable
  over string literals, and the package's other files and the stand-in
  (``elsewhere``) never name ``A``;
- ``C`` is built of comparisons, ``not``, ``and``, constants and attributes
  ``self.X``, and each such ``X`` is stored once in the module, by a statement
  of the same ``__init__``'s body before ``line``, named by no string of the
  module and by no text of ``elsewhere``: ``C`` has the same value at every
  read as at the store.

The premise: comparisons of the same objects are deterministic. Anything else
is not proved.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable

from mutation_proof_paths import _conjuncts, stored_elsewhere
from mutation_proofs import _parsed

_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
_BY_NAME = {"getattr", "setattr", "delattr", "hasattr"}
_CONDITION_NODES = (
    ast.Compare,
    ast.UnaryOp,
    ast.Not,
    ast.BoolOp,
    ast.And,
    ast.Constant,
    ast.Attribute,
    ast.Name,
    ast.expr_context,
    ast.cmpop,
)


def unread_alternative(code: str, mutated: str, line: int, elsewhere: Iterable[str]) -> str | None:
    """Why the mutant ``mutated`` of ``code`` (changed at ``line``) is equivalent, or None."""
    tree, parents = _parsed(code)  # shared with the other proofs: left as it was found
    store = _store_at(tree, line, parents)
    if store is None or not _only_the_alternative_differs(tree, ast.parse(mutated), line):
        return None
    init = parents[store]
    cls = parents[init]
    this = init.args.args[0].arg
    attribute = store.targets[0].attr
    condition = store.value.test
    if not _stable(condition, this, init, store, tree, elsewhere) or _reflective(tree, parents):
        return None
    if not _read_only_under(attribute, condition, cls, store, tree, parents, elsewhere):
        return None
    return f"self.{attribute}'s `else` value: every read of it runs under `if {ast.unparse(condition)}`"


def _store_at(tree: ast.Module, line: int, parents: dict) -> ast.Assign | None:
    """``self.A = X if C else <constant>`` at ``line``, a statement of a module-level class's ``__init__``."""
    store = next((n for n in ast.walk(tree) if isinstance(n, ast.Assign) and n.lineno == line), None)
    if store is None or len(store.targets) != 1 or not isinstance(store.value, ast.IfExp):
        return None
    init, target = parents.get(store), store.targets[0]
    if not isinstance(init, ast.FunctionDef) or init.name != "__init__" or store not in init.body:
        return None
    if (
        not isinstance(parents.get(init), ast.ClassDef)
        or parents[init] not in tree.body
        or not init.args.args
    ):
        return None
    this = init.args.args[0].arg
    if not (
        isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == this
    ):
        return None
    return store if isinstance(store.value.orelse, ast.Constant) else None


def _only_the_alternative_differs(tree: ast.Module, changed: ast.Module, line: int) -> bool:
    """The mutant differs from the port in the ``else`` constant at ``line`` alone."""
    found = []
    for module in (tree, changed):
        store = next((n for n in ast.walk(module) if isinstance(n, ast.Assign) and n.lineno == line), None)
        if store is None or not isinstance(store.value, ast.IfExp):
            return False
        if not isinstance(store.value.orelse, ast.Constant):
            return False
        found.append(store.value)
    original, mutant = found
    if ast.dump(original.orelse) == ast.dump(mutant.orelse):
        return False
    saved = original.orelse, mutant.orelse
    original.orelse = mutant.orelse = ast.Constant(value=None)
    try:
        return ast.dump(tree) == ast.dump(changed)
    finally:
        original.orelse, mutant.orelse = saved


def _stable(
    condition: ast.expr, this: str, init: ast.FunctionDef, store: ast.Assign, tree: ast.Module, elsewhere
) -> bool:
    """``C`` reads only ``self.X`` stored once, before the store, by ``__init__``'s own statements."""
    for node in ast.walk(condition):
        if not isinstance(node, _CONDITION_NODES):
            return False
        if isinstance(node, ast.UnaryOp) and not isinstance(node.op, ast.Not):
            return False
        if isinstance(node, ast.Name) and node.id != this:
            return False
        if isinstance(node, ast.Attribute):
            if not (isinstance(node.value, ast.Name) and node.value.id == this):
                return False
            if not _stored_once_before(node.attr, init, store, tree, elsewhere):
                return False
    return True


def _stored_once_before(
    name: str, init: ast.FunctionDef, store: ast.Assign, tree: ast.Module, elsewhere
) -> bool:
    stores = [n for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == name and not _loads(n)]
    if len(stores) != 1 or _named(name, tree, elsewhere, stores_only=True):
        return False
    statement = next((s for s in init.body if any(n is stores[0] for n in ast.walk(s))), None)
    return statement is not None and statement.lineno < store.lineno and isinstance(statement, ast.Assign)


def _read_only_under(
    attribute: str,
    condition: ast.expr,
    cls: ast.ClassDef,
    store: ast.Assign,
    tree: ast.Module,
    parents,
    elsewhere,
) -> bool:
    if _named(attribute, tree, elsewhere, stores_only=False):
        return False
    if any(isinstance(c, ast.ClassDef) and any(_names(b, cls.name) for b in c.bases) for c in ast.walk(tree)):
        return False
    target = store.targets[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == attribute and node is not target:
            if not (_loads(node) and _guarded(node, condition, cls, parents)):
                return False
    return True


def _guarded(read: ast.Attribute, condition: ast.expr, cls: ast.ClassDef, parents: dict) -> bool:
    """``self.A`` in a method of ``cls``, in the body of an ``if`` having ``condition`` as a conjunct."""
    wanted = ast.dump(condition)
    guarded, child, node = False, read, parents.get(read)
    while node is not None and not isinstance(node, _SCOPES):
        if isinstance(node, ast.If) and child in node.body:
            guarded = guarded or any(ast.dump(c) == wanted for c in _conjuncts(node.test))
        child, node = node, parents.get(node)
    if not guarded or not isinstance(node, ast.FunctionDef) or parents.get(node) is not cls:
        return False
    this = node.args.args[0].arg if node.args.args else None
    if not (isinstance(read.value, ast.Name) and read.value.id == this):
        return False
    rebinds = [n for n in ast.walk(node) if isinstance(n, ast.Name) and n.id == this and not _loads(n)]
    return not rebinds and _same_self(condition, this)


def _same_self(condition: ast.expr, this: str) -> bool:
    return all(n.id == this for n in ast.walk(condition) if isinstance(n, ast.Name))


def _loads(node: ast.Attribute | ast.Name) -> bool:
    return isinstance(node.ctx, ast.Load)


def _names(node: ast.expr, name: str) -> bool:
    return any(
        isinstance(n, ast.Name) and n.id == name or isinstance(n, ast.Attribute) and n.attr == name
        for n in ast.walk(node)
    )


def _reflective(tree: ast.Module, parents: dict) -> bool:
    """Whether the module reads ``__dict__``, calls ``vars``, or names an
    attribute by a computed string (``getattr``/``setattr``/``delattr``/``hasattr``
    with a name other than a string literal or a ``for`` loop's variable over
    string literals)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "__dict__":
            return True
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
            continue
        if node.func.id == "vars":
            return True
        if node.func.id in _BY_NAME and not (len(node.args) > 1 and _literal_name(node.args[1], parents)):
            return True
    return False


def _literal_name(name: ast.expr, parents: dict) -> bool:
    """A string literal, or the variable of an enclosing ``for`` over string
    literals that its body never binds."""
    if isinstance(name, ast.Constant):
        return isinstance(name.value, str)
    if not isinstance(name, ast.Name):
        return False
    node = parents.get(name)
    while node is not None and not isinstance(node, _SCOPES):
        if isinstance(node, ast.For) and isinstance(node.target, ast.Name) and node.target.id == name.id:
            literals = isinstance(node.iter, (ast.Tuple, ast.List)) and all(
                isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.iter.elts
            )
            bound = [
                n
                for b in node.body
                for n in ast.walk(b)
                if isinstance(n, ast.Name) and n.id == name.id and not _loads(n)
            ]
            return literals and not bound
        node = parents.get(node)
    return False


def _named(name: str, tree: ast.Module, elsewhere: Iterable[str], stores_only: bool) -> bool:
    """Whether a string of the module is ``name``, or another text names it
    (stores it, when ``stores_only``)."""
    if any(isinstance(n, ast.Constant) and n.value == name for n in ast.walk(tree)):
        return True
    if stores_only:
        return stored_elsewhere(name, elsewhere)
    pattern = re.compile(rf"\b{re.escape(name)}\b")
    return any(pattern.search(text) for text in elsewhere)
