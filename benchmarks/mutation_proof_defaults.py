"""Proofs that a mutated default value is never taken (benchmarks/mutation.py).

A mutant that changes only a literal default (``const``, ``bool``, ``unary``
inside it, the mutated default still a literal) is equivalent when that
default is provably never used:

``unused_default(code, mutant, elsewhere)``: the default of a parameter ``P``
of a module-level function ``F`` (``def F(..., P=<literal>)``) when every
reference to ``F`` in the module is a call that passes ``P`` (by keyword, or
positionally without ``*``/``**`` before it), ``F`` is bound once, has no
decorator, the module reads no signature or ``__defaults__``, and no other
file of the package nor the stand-in names ``F`` (``elsewhere``: their texts).

``required_key(code, mutant, requires)``: the default ``d`` of ``R.get(K, d)``
on the RoPE parameters ``R`` when the value can only matter for RoPE types
whose parameters transformers' validation requires to hold ``K``
(``requires(rope_type, K)``: ``transformers_requires`` reads it from the
installed transformers, by calling the config class's own validation). ``R``
is bound once, to ``config.rope_parameters`` or ``config.rope_scaling``
(optionally ``dict(... or {})``), where ``config`` is a parameter of the
function, and only read (``R.get``, ``R[...]``) anywhere in the module. The
RoPE type ``T`` is a local or ``self`` attribute bound once, to
``R.get("rope_type"[, ...])[ or "<literal>"]``. Either

- the call runs only inside ``if T == "t":`` (or ``T in ("t", ...)``) with
  ``K`` required for every ``t``; or
- the call's value is stored once as ``self.A`` and every read of ``.A`` in
  the module is in that class, inside such an ``if`` or in a private method
  called only from such places, and no string nor outside text names ``A``.

Premise: the config the port receives is one transformers built (its
construction runs the validation, which raises ``KeyError`` on a missing
required key) and not edited since. Anything else is not proved.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Callable, Iterable

from mutation_operators import Mutant

Requires = Callable[[str, str], bool]
REFLECTION = ("__defaults__", "__kwdefaults__", "signature(", "getfullargspec", "getargspec")


def unused_default(code: str, mutant: Mutant, elsewhere: Iterable[str]) -> str | None:
    """Why the mutant's changed default of a module-level function is never used, or None."""
    if not _touches_default(code, mutant):
        return None
    tree, spans = _tree(code), _Spans(code)
    for function in tree.body:
        if not isinstance(function, ast.FunctionDef) or function.decorator_list:
            continue
        for name, default, position in _defaults(function):
            if not spans.literal_change(default, mutant):
                continue
            if any(marker in code for marker in REFLECTION) or _named(function.name, elsewhere):
                return None
            if _always_passed(tree, function.name, name, position):
                return f"every call of {function.name} passes {name}: its default is never used"
            return None
    return None


def required_key(code: str, mutant: Mutant, requires: Requires, elsewhere: Iterable[str]) -> str | None:
    """Why the mutant's changed default of ``R.get(K, d)`` on RoPE parameters is never used, or None."""
    if not _touches_default(code, mutant):
        return None
    tree, spans, parents = _tree(code), _Spans(code), _parents(code)
    for call in ast.walk(tree):
        if not (_is_get(call) and len(call.args) == 2 and spans.literal_change(call.args[1], mutant)):
            continue
        key = call.args[0].value  # type: ignore[attr-defined]
        rope = _RopeDict(tree, parents, call)
        if not rope.valid():
            return None
        if rope.guarded(call, key, requires):
            return f"run only for RoPE types whose parameters transformers requires to hold {key!r}"
        if rope.stored_and_read_guarded(call, key, requires, elsewhere):
            return f"its attribute is read only for RoPE types whose parameters transformers requires to hold {key!r}"
        return None
    return None


def transformers_requires(config_class: type) -> Requires:
    """``requires(rope_type, key)``: whether constructing ``config_class``
    with RoPE parameters of that type lacking ``key`` raises transformers'
    missing-key error (its ``_validate_<type>_rope_parameters`` declares the
    key required, and its ``validate_rope`` is transformers' own)."""
    from transformers.modeling_rope_utils import RotaryEmbeddingConfigMixin

    cache: dict[tuple[str, str], bool] = {}

    def requires(rope_type: str, key: str) -> bool:
        if (rope_type, key) not in cache:
            cache[rope_type, key] = _requires(config_class, RotaryEmbeddingConfigMixin, rope_type, key)
        return cache[rope_type, key]

    return requires


def _requires(config_class: type, mixin: type, rope_type: str, key: str) -> bool:
    if getattr(config_class, "validate_rope", None) is not mixin.validate_rope:  # type: ignore[attr-defined]
        return False
    validation = getattr(config_class, f"_validate_{rope_type}_rope_parameters", None)
    declared = _declared_required(validation, rope_type) if validation else None
    if declared is None or key not in declared:
        return False
    parameters = {name: 1.0 for name in declared - {key, "rope_type"}}
    try:
        config_class(rope_parameters={"rope_type": rope_type, **parameters})
    except KeyError as error:
        return repr(key) in str(error)
    except Exception:  # noqa: BLE001 - any other refusal proves nothing
        return False
    return False


class _Recorded(Exception):
    pass


def _declared_required(validation: Callable, rope_type: str) -> set[str] | None:
    """The required keys the validation function hands to ``_check_received_keys``."""
    seen: list[set[str]] = []

    def record(_type, _received, required, *_args, **_kwargs):
        seen.append(set(required))
        raise _Recorded

    owner = type("Recorder", (), {"_check_received_keys": staticmethod(record)})()
    try:
        validation(owner, {"rope_type": rope_type}, ignore_keys=None)
    except _Recorded:
        return seen[0]
    except Exception:  # noqa: BLE001 - a validation of another shape proves nothing
        return None
    return None


# -- shared --------------------------------------------------------------------


@functools.lru_cache(maxsize=8)
def _tree(code: str) -> ast.Module:
    return ast.parse(code)


@functools.lru_cache(maxsize=8)
def _parents(code: str) -> dict[ast.AST, ast.AST]:
    tree = _tree(code)
    return {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


@functools.lru_cache(maxsize=8)
def _defaulted_literals(code: str) -> list[ast.expr]:
    """Every literal default of a module-level function and every second argument of a ``.get``."""
    tree = _tree(code)
    found: list[ast.expr] = [c.args[1] for c in ast.walk(tree) if _is_get(c) and len(c.args) == 2]  # type: ignore[attr-defined]
    for function in tree.body:
        if isinstance(function, ast.FunctionDef):
            found += [default for _, default, _ in _defaults(function)]
    return found


class _Spans:
    """Character offsets of AST nodes, to compare with a mutant's span."""

    def __init__(self, code: str) -> None:
        self.lines = code.splitlines(keepends=True)
        self.starts = [0]
        for line in self.lines:
            self.starts.append(self.starts[-1] + len(line))

    def offset(self, line: int, byte_column: int) -> int:
        text = self.lines[line - 1].encode("utf-8")[:byte_column].decode("utf-8", "replace")
        return self.starts[line - 1] + len(text)

    def literal_change(self, node: ast.expr, mutant: Mutant) -> bool:
        """Whether the mutant replaces a part of ``node``, a literal, and leaves a literal."""
        if mutant.operator not in ("const", "bool", "unary"):
            return False
        start = self.offset(node.lineno, node.col_offset)
        end = self.offset(node.end_lineno or node.lineno, node.end_col_offset or 0)
        first, last = (
            self.starts[mutant.line - 1] + mutant.column,
            self.starts[mutant.end_line - 1] + mutant.end_column,
        )
        if not start <= first <= last <= end:
            return False
        text = "".join(self.lines)[start:end]
        changed = text[: first - start] + mutant.replacement + text[last - start :]
        return _literal(text) and _literal(changed)


def _touches_default(code: str, mutant: Mutant) -> bool:
    """Whether the mutant's first line falls within a candidate default (a cheap filter)."""
    return mutant.operator in ("const", "bool", "unary") and any(
        node.lineno <= mutant.line <= (node.end_lineno or node.lineno) for node in _defaulted_literals(code)
    )


def _shape(node: ast.AST) -> str:
    """The node's dump without load / store contexts."""
    return re.sub(r",? ?ctx=\w+\(\)", "", ast.dump(node))


def _literal(text: str) -> bool:
    try:
        ast.literal_eval(text.strip())
    except (ValueError, SyntaxError):
        return False
    return True


def _named(name: str, texts: Iterable[str]) -> bool:
    pattern = re.compile(rf"\b{re.escape(name)}\b")
    return any(pattern.search(text) for text in texts)


# -- unused_default --------------------------------------------------------------


def _defaults(function: ast.FunctionDef) -> list[tuple[str, ast.expr, int | None]]:
    """(parameter, default, position or None for keyword-only) of each defaulted parameter."""
    positional = function.args.posonlyargs + function.args.args
    found: list[tuple[str, ast.expr, int | None]] = []
    for index, default in enumerate(function.args.defaults, len(positional) - len(function.args.defaults)):
        found.append((positional[index].arg, default, index))
    for arg, default in zip(function.args.kwonlyargs, function.args.kw_defaults, strict=True):
        if default is not None:
            found.append((arg.arg, default, None))
    return found


def _always_passed(tree: ast.Module, function: str, parameter: str, position: int | None) -> bool:
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    bindings = [
        n
        for n in ast.walk(tree)
        if (isinstance(n, ast.Name) and n.id == function and not isinstance(n.ctx, ast.Load))
        or (isinstance(n, ast.FunctionDef | ast.ClassDef | ast.AsyncFunctionDef) and n.name == function)
        or (isinstance(n, ast.alias) and (n.asname or n.name) == function)
    ]
    if len(bindings) != 1:
        return False
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id == function:
            call = parents.get(node)
            if not (isinstance(call, ast.Call) and call.func is node and _passes(call, parameter, position)):
                return False
    return True


def _passes(call: ast.Call, parameter: str, position: int | None) -> bool:
    if any(k.arg is None for k in call.keywords):
        return False
    if any(k.arg == parameter for k in call.keywords):
        return True
    if position is None:
        return False
    before = call.args[: position + 1]
    return len(call.args) > position and not any(isinstance(a, ast.Starred) for a in before)


# -- required_key ----------------------------------------------------------------


def _is_get(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "get"
        and not node.keywords
        and bool(node.args)
        and isinstance(node.args[0], ast.Constant)
        and isinstance(node.args[0].value, str)
    )


def _self_attribute(node: ast.AST) -> str | None:
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
        return node.attr
    return None


class _RopeDict:
    """The dict a ``.get`` call reads, where it is bound, and the RoPE type read from it."""

    def __init__(self, tree: ast.Module, parents: dict, call: ast.Call) -> None:
        self.tree, self.parents, self.call = tree, parents, call
        self.receiver = call.func.value  # type: ignore[attr-defined]
        self.function = self._enclosing(call, (ast.FunctionDef,))
        self.cls = self._enclosing(call, (ast.ClassDef,))

    def _enclosing(self, node: ast.AST, kinds: tuple[type, ...]) -> ast.AST | None:
        while node in self.parents:
            node = self.parents[node]
            if isinstance(node, kinds):
                return node
        return None

    # the dict ------------------------------------------------------------------

    def _stores(self, target: ast.expr, scope: ast.AST) -> list[ast.AST]:
        """Every statement or node binding ``target`` (a local in ``scope``, or ``self.X`` in the module)."""
        attribute = _self_attribute(target)
        found: list[ast.AST] = []
        if attribute is not None:
            for node in ast.walk(self.tree):
                if (
                    isinstance(node, ast.Attribute)
                    and node.attr == attribute
                    and not isinstance(node.ctx, ast.Load)
                ):
                    found.append(self.parents[node])
            return found
        if not isinstance(target, ast.Name):
            return [scope]  # not a plain name: never proved
        for node in ast.walk(scope):
            if isinstance(node, ast.Name) and node.id == target.id and not isinstance(node.ctx, ast.Load):
                found.append(self.parents[node])
            elif isinstance(node, ast.arg) and node.arg == target.id:
                found.append(node)
        return found

    def _single_assign(self, target: ast.expr, scope: ast.AST) -> ast.Assign | None:
        stores = self._stores(target, scope)
        if len(stores) == 1 and isinstance(stores[0], ast.Assign) and len(stores[0].targets) == 1:
            return stores[0]
        return None

    def valid(self) -> bool:
        """``R`` bound once to the config's RoPE parameters and only read, in the function or class."""
        if self.function is None:
            return False
        bound = self._single_assign(self.receiver, self.function)
        if bound is None or self._enclosing(bound, (ast.FunctionDef,)) is not self.function:
            return False
        if not _config_rope(bound.value, self.function):  # type: ignore[arg-type]
            return False
        return self._only_read(self.receiver)

    def _only_read(self, receiver: ast.expr, scope: ast.AST | None = None, depth: int = 2) -> bool:
        """Every use of ``receiver`` is ``receiver.get(...)``, ``receiver[...]``
        read, or a positional argument of a ``self`` method of the class whose
        parameter is itself only read (``depth`` calls down)."""
        shape = _shape(receiver)
        if scope is None:
            scope = self.tree if _self_attribute(receiver) else self.function
        for node in ast.walk(scope):  # type: ignore[arg-type]
            if not (isinstance(node, ast.Name | ast.Attribute) and _shape(node) == shape):
                continue
            parent = self.parents[node]
            if not isinstance(node.ctx, ast.Load):
                continue  # the one binding (``_single_assign``)
            read = isinstance(parent, ast.Subscript) and isinstance(parent.ctx, ast.Load)
            getter = (
                isinstance(parent, ast.Attribute)
                and parent.attr == "get"
                and isinstance(self.parents.get(parent), ast.Call)
            )
            if not (read or getter or (depth and self._passed_to_reader(node, parent, depth))):
                return False
        return True

    def _passed_to_reader(self, node: ast.expr, call: ast.AST, depth: int) -> bool:
        """``self.m(..., node, ...)`` where ``m``'s parameter at that place is only read."""
        if not (isinstance(call, ast.Call) and node in call.args and _self_attribute(call.func)):
            return False
        if any(isinstance(a, ast.Starred) for a in call.args) or self.cls is None:
            return False
        methods = [
            n
            for n in self.cls.body
            if isinstance(n, ast.FunctionDef) and n.name == call.func.attr  # type: ignore[attr-defined]
        ]
        if len(methods) != 1 or methods[0].decorator_list:
            return False
        parameters = methods[0].args.args[1:]
        index = call.args.index(node)
        if methods[0].args.posonlyargs or index >= len(parameters):
            return False
        name = parameters[index].arg
        stores = [
            n
            for n in ast.walk(methods[0])
            if isinstance(n, ast.Name) and n.id == name and not isinstance(n.ctx, ast.Load)
        ]
        return not stores and self._only_read(ast.Name(id=name, ctx=ast.Load()), methods[0], depth - 1)

    # the RoPE type -------------------------------------------------------------

    def _type_reads(self) -> list[tuple[ast.expr, ast.AST, set[object]]]:
        """(RoPE type expression, scope where it is compared, its fallback
        literals) of each target bound to ``R.get("rope_type", ...)`` in the function."""
        found = []
        for node in ast.walk(self.function):  # type: ignore[arg-type]
            if not (isinstance(node, ast.Assign) and len(node.targets) == 1):
                continue
            fallbacks = self._reads_type(node.value)
            target = node.targets[0]
            if fallbacks is not None and self._single_assign(target, self.function) is node:  # type: ignore[arg-type]
                found.append((target, self.cls if _self_attribute(target) else self.function, fallbacks))
        return found

    def _reads_type(self, value: ast.expr) -> set[object] | None:
        """The literals ``R.get("rope_type"[, R.get("type") | literal])[ or literal]``
        falls back to (an empty or unvalidated ``R``), or None for another expression."""
        fallbacks: set[object] = {None}
        if isinstance(value, ast.BoolOp) and isinstance(value.op, ast.Or) and len(value.values) == 2:
            if not isinstance(value.values[1], ast.Constant):
                return None
            fallbacks.add(value.values[1].value)
            value = value.values[0]
        if not (_is_get(value) and value.args[0].value == "rope_type" and self._same(value.func.value)):  # type: ignore[attr-defined]
            return None
        for extra in value.args[1:]:  # type: ignore[attr-defined]
            if isinstance(extra, ast.Constant):
                fallbacks.add(extra.value)
            elif not (_is_get(extra) and extra.args[0].value == "type" and len(extra.args) == 1):  # type: ignore[attr-defined]
                return None
            elif not self._same(extra.func.value):  # type: ignore[attr-defined]
                return None
        return fallbacks

    def _same(self, node: ast.expr) -> bool:
        return _shape(node) == _shape(self.receiver)

    def _guard_types(self, test: ast.expr, rope_type: ast.expr) -> list[str] | None:
        if not (isinstance(test, ast.Compare) and len(test.ops) == 1):
            return None
        left, right, op = test.left, test.comparators[0], test.ops[0]
        if _shape(right) == _shape(rope_type):
            left, right = right, left
        if _shape(left) != _shape(rope_type):
            return None
        if isinstance(op, ast.Eq) and isinstance(right, ast.Constant) and isinstance(right.value, str):
            return [right.value]
        if isinstance(op, ast.In) and isinstance(right, ast.Tuple | ast.Set | ast.List):
            values = [e.value for e in right.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
            return values if len(values) == len(right.elts) else None
        return None

    def _inside_guard(self, node: ast.AST, key: str, requires: Requires, stop: ast.AST) -> bool:
        """Whether ``node`` sits in the body of an ``if`` on the RoPE type (below ``stop``)
        whose every type requires ``key``."""
        for rope_type, scope, fallbacks in self._type_reads():
            child = node
            while child in self.parents and child is not stop:
                parent = self.parents[child]
                if isinstance(parent, ast.If) and any(child is s for s in parent.body):
                    types = self._guard_types(parent.test, rope_type)
                    in_scope = scope is not None and self._within(parent, scope)
                    required = types and all(t not in fallbacks and requires(t, key) for t in types)
                    if required and in_scope:
                        return True
                child = parent
        return False

    def _within(self, node: ast.AST, scope: ast.AST) -> bool:
        while node in self.parents:
            node = self.parents[node]
            if node is scope:
                return True
        return False

    def guarded(self, call: ast.Call, key: str, requires: Requires) -> bool:
        return self._inside_guard(call, key, requires, self.function)  # type: ignore[arg-type]

    # a stored value read under guards -----------------------------------------------

    def stored_and_read_guarded(
        self, call: ast.Call, key: str, requires: Requires, elsewhere: Iterable[str]
    ) -> bool:
        statement = self.parents.get(call)
        while statement is not None and not isinstance(statement, ast.stmt):
            statement = self.parents.get(statement)
        if not (isinstance(statement, ast.Assign) and len(statement.targets) == 1):
            return False
        if not _plain_value(statement.value, call):
            return False
        attribute = _self_attribute(statement.targets[0])
        if attribute is None or self.cls is None or _named(attribute, elsewhere):
            return False
        if self._named_by_string(attribute):
            return False
        reads = [
            n
            for n in ast.walk(self.tree)
            if isinstance(n, ast.Attribute) and n.attr == attribute and isinstance(n.ctx, ast.Load)
        ]
        return all(self._read_guarded(n, key, requires, elsewhere, depth=3) for n in reads)

    def _named_by_string(self, name: str) -> bool:
        """Whether the module could reach attribute ``name`` by a string: a
        string ``name`` other than a key read from the RoPE dict, an attribute
        access by a computed name, or the instance's ``__dict__``."""
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Constant) and node.value == name and not self._rope_key(node):
                return True
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                reflective = node.func.id in ("getattr", "setattr", "hasattr", "delattr")
                if reflective and name in self._attribute_names(node):
                    return True
                if node.func.id == "vars":
                    return True
            if isinstance(node, ast.Attribute) and node.attr == "__dict__":
                return True
        return False

    def _attribute_names(self, call: ast.Call) -> set[object]:
        """The names a ``getattr``-like call can reach: its literal, or the
        literals of the ``for`` loops that alone bind its name argument; every
        name (``{ANY_NAME}``-like: the set of all) otherwise."""
        everything = _Everything()
        if len(call.args) < 2:
            return everything
        name = call.args[1]
        if isinstance(name, ast.Constant):
            return {name.value}
        function = self._enclosing(call, (ast.FunctionDef,))
        if not isinstance(name, ast.Name) or function is None:
            return everything
        values: set[object] = set()
        for node in ast.walk(function):
            bound = isinstance(node, ast.Name) and node.id == name.id and not isinstance(node.ctx, ast.Load)
            if not bound and not (isinstance(node, ast.arg) and node.arg == name.id):
                continue
            loop = self.parents.get(node)
            items = loop.iter if isinstance(loop, ast.For) and loop.target is node else None
            if not isinstance(items, ast.Tuple | ast.List) or not all(
                isinstance(e, ast.Constant) for e in items.elts
            ):
                return everything
            values |= {e.value for e in items.elts}  # type: ignore[attr-defined]
        return values or everything

    def _rope_key(self, node: ast.Constant) -> bool:
        """A key of ``R.get(key, ...)`` or ``R[key]``."""
        parent = self.parents.get(node)
        if isinstance(parent, ast.Call) and _is_get(parent) and parent.args[0] is node:
            return self._same(parent.func.value)  # type: ignore[attr-defined]
        return isinstance(parent, ast.Subscript) and parent.slice is node and self._same(parent.value)

    def _read_guarded(
        self, node: ast.AST, key: str, requires: Requires, elsewhere: Iterable[str], depth: int
    ) -> bool:
        method = self._enclosing(node, (ast.FunctionDef,))
        if method is None or self._enclosing(method, (ast.ClassDef,)) is not self.cls:
            return False
        if self._inside_guard(node, key, requires, method):
            return True
        name = method.name  # type: ignore[attr-defined]
        if depth == 0 or not name.startswith("_") or name.startswith("__") or _named(name, elsewhere):
            return False
        uses = [n for n in ast.walk(self.tree) if isinstance(n, ast.Attribute) and n.attr == name]
        if self._named_by_string(name):
            return False
        for use in uses:
            call = self.parents.get(use)
            if _self_attribute(use) is None or not (isinstance(call, ast.Call) and call.func is use):
                return False
            if not self._read_guarded(call, key, requires, elsewhere, depth - 1):
                return False
        return bool(uses)


def _config_rope(value: ast.expr, function: ast.FunctionDef) -> bool:
    """``config.rope_parameters`` / ``config.rope_scaling``, optionally ``dict(... or {})``,
    ``config`` a parameter of the function."""
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "dict":
        if len(value.args) != 1 or value.keywords:
            return False
        value = value.args[0]
    if isinstance(value, ast.BoolOp) and isinstance(value.op, ast.Or) and len(value.values) == 2:
        empty = value.values[1]
        if not (isinstance(empty, ast.Dict) and not empty.keys):
            return False
        value = value.values[0]
    parameters = {a.arg for a in function.args.args + function.args.kwonlyargs}
    return (
        isinstance(value, ast.Attribute)
        and value.attr in ("rope_parameters", "rope_scaling")
        and isinstance(value.value, ast.Name)
        and value.value.id in parameters
    )


def _plain_value(value: ast.expr, call: ast.Call) -> bool:
    """The stored value is the call itself, or ``float`` / ``int`` / ``bool`` of it
    (which a numeric literal default cannot make raise)."""
    if value is call:
        return True
    return (
        isinstance(value, ast.Call)
        and isinstance(value.func, ast.Name)
        and value.func.id in ("float", "int", "bool")
        and value.args == [call]
        and not value.keywords
    )


class _Everything(set):
    """The set of every name (a computed attribute name could be any)."""

    def __contains__(self, _item: object) -> bool:
        return True
