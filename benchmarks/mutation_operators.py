"""Mutation operators of the mutation benchmark (benchmarks/mutation.py), on LibCST.

``mutants(code)`` lists every mutant of one module: each is one node of the
module replaced by another, with the operator that made it, the lines it
spans and a one-line description. ``mutated(code, mutant)`` is the module's
code with that replacement made; ``normalised(code)`` is a canonical form of
a module (its AST with argument orders that do not matter sorted), so that a
mutant whose normalised form equals the original's is equivalent by proof.

Operators (``OPERATORS``):

- ``arith``: ``+`` and ``-``, ``*`` and ``/`` swapped, ``//`` to ``/``, ``%``
  to ``//``, ``**`` to ``*``, ``@`` to ``*`` (also in augmented assignments);
- ``unary``: a unary ``-`` or ``not`` removed;
- ``compare``: ``==``/``!=``, ``<``/``>=``, ``>``/``<=``, ``is``/``is not``,
  ``in``/``not in`` inverted;
- ``boolop``: ``and`` and ``or`` swapped;
- ``bool``: a ``True`` or ``False`` literal flipped (outside kernel calls);
- ``const``: an integer ``n`` to ``n + 1``, a float ``x`` to ``2 x`` (``1.0``
  for ``0.0``), outside dimension arguments;
- ``nf-drop``: one argument of an ``NF.<kernel>(...)`` call dropped;
- ``nf-swap``: the values of two adjacent arguments of an ``NF`` call swapped;
- ``nf-option``: a ``True``/``False`` keyword option of an ``NF`` call flipped;
- ``dim``: a ``dim=`` argument, or the dimension of ``transpose``,
  ``unsqueeze``, ``softmax``, ``sum``... moved by one (``k + 1``, negative
  ``k - 1``); the two dimensions of ``transpose`` / ``swapaxes`` swapped;
- ``stmt``: a simple statement in a function body (an assignment, an
  augmented assignment or an expression statement, not a docstring) replaced
  by ``pass``.

Not mutated: error paths and messages (``raise`` statements, ``assert``),
annotations, strings, and calls that only log or warn.
"""

from __future__ import annotations

import ast
import enum
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

OPERATORS = (
    "arith",
    "unary",
    "compare",
    "boolop",
    "bool",
    "const",
    "nf-drop",
    "nf-swap",
    "nf-option",
    "dim",
    "stmt",
)

ARITH = {
    cst.Add: cst.Subtract,
    cst.Subtract: cst.Add,
    cst.Multiply: cst.Divide,
    cst.Divide: cst.Multiply,
    cst.FloorDivide: cst.Divide,
    cst.Modulo: cst.FloorDivide,
    cst.Power: cst.Multiply,
    cst.MatrixMultiply: cst.Multiply,
}
AUG = {
    cst.AddAssign: cst.SubtractAssign,
    cst.SubtractAssign: cst.AddAssign,
    cst.MultiplyAssign: cst.DivideAssign,
    cst.DivideAssign: cst.MultiplyAssign,
    cst.FloorDivideAssign: cst.DivideAssign,
}
COMPARE = {
    cst.Equal: cst.NotEqual,
    cst.NotEqual: cst.Equal,
    cst.LessThan: cst.GreaterThanEqual,
    cst.GreaterThanEqual: cst.LessThan,
    cst.GreaterThan: cst.LessThanEqual,
    cst.LessThanEqual: cst.GreaterThan,
    cst.Is: cst.IsNot,
    cst.IsNot: cst.Is,
    cst.In: cst.NotIn,
    cst.NotIn: cst.In,
}
BOOLOP = {cst.And: cst.Or, cst.Or: cst.And}
# methods and functions whose integer positional arguments are dimensions
DIM_CALLS = frozenset(
    {"transpose", "swapaxes", "unsqueeze", "squeeze", "softmax", "log_softmax", "sum", "mean", "amax"}
    | {"argmax", "cumsum", "flatten", "movedim", "size"}
)
ORDERLESS_PAIRS = frozenset({"transpose", "swapaxes"})  # f(a, b) is f(b, a)
QUIET_CALLEES = frozenset({"warn", "debug", "info", "warning", "error", "print", "warning_once"})


@dataclass(frozen=True)
class Mutant:
    """One node of a module replaced by another."""

    operator: str
    line: int
    column: int
    end_line: int
    end_column: int
    description: str
    replacement: str  # the code that replaces lines line:column to end_line:end_column

    @property
    def key(self) -> str:
        return f"{self.operator}@{self.line}:{self.column}:{self.description}"


def _op_text(op: cst.CSTNode) -> str:
    return _code(op).strip()


def _same_spacing(op: cst.CSTNode, new_type: type) -> cst.CSTNode:
    fields = {
        name: getattr(op, name) for name in ("whitespace_before", "whitespace_after") if hasattr(op, name)
    }
    if new_type in (cst.IsNot, cst.NotIn):
        fields["whitespace_between"] = cst.SimpleWhitespace(" ")
    if isinstance(op, cst.IsNot | cst.NotIn):
        fields.pop("whitespace_between", None)
    return new_type(**fields)


def _int_value(node: cst.CSTNode) -> int | None:
    """The value of an integer literal, or of ``-`` an integer literal."""
    if isinstance(node, cst.Integer):
        return int(node.evaluated_value)
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus):
        inner = _int_value(node.expression)
        return None if inner is None else -inner
    return None


def _int_node(value: int, like: cst.CSTNode) -> cst.BaseExpression:
    node: cst.BaseExpression = cst.Integer(str(abs(value)))
    if value < 0:
        node = cst.UnaryOperation(cst.Minus(), node)
    return node.with_changes(lpar=like.lpar, rpar=like.rpar)  # type: ignore[attr-defined]


def _shifted(value: int) -> int:
    return value + 1 if value >= 0 else value - 1


def _callee_name(call: cst.Call) -> str | None:
    if isinstance(call.func, cst.Attribute):
        return call.func.attr.value
    if isinstance(call.func, cst.Name):
        return call.func.value
    return None


def _is_nf_call(call: cst.Call) -> bool:
    func = call.func
    return isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value == "NF"


def _is_quiet(statement: cst.BaseSmallStatement) -> bool:
    """An expression statement that only logs or warns."""
    return (
        isinstance(statement, cst.Expr)
        and isinstance(statement.value, cst.Call)
        and _callee_name(statement.value) in QUIET_CALLEES
    )


def _is_docstring(statement: cst.SimpleStatementLine) -> bool:
    body = statement.body
    return len(body) == 1 and isinstance(body[0], cst.Expr) and isinstance(body[0].value, cst.SimpleString)


class _Sites(cst.CSTVisitor):
    """Walks a module and lists its mutants."""

    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self) -> None:
        self.found: list[Mutant] = []
        self.functions = 0  # depth of function bodies
        self.quiet = 0  # depth of code that is never mutated
        self.handled: set[int] = set()  # ids of nodes another operator owns

    def add(self, operator: str, node: cst.CSTNode, new: cst.CSTNode, description: str) -> None:
        span = self.get_metadata(PositionProvider, node)
        start, end = span.start, span.end
        text = "pass" if operator == "stmt" else _code(new)
        self.found.append(Mutant(operator, start.line, start.column, end.line, end.column, description, text))

    # -- contexts ------------------------------------------------------------

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.functions += 1

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self.functions -= 1

    def visit_Raise(self, node: cst.Raise) -> bool:
        return False

    def visit_Assert(self, node: cst.Assert) -> bool:
        return False

    def visit_Annotation(self, node: cst.Annotation) -> bool:
        return False

    def visit_Decorator(self, node: cst.Decorator) -> bool:
        return False

    def visit_FormattedString(self, node: cst.FormattedString) -> bool:
        return False

    def visit_Call(self, node: cst.Call) -> bool:
        if _callee_name(node) in QUIET_CALLEES:
            return False
        if _is_nf_call(node):
            self._nf_call(node)
        self._dims(node)
        return True

    # -- operators -----------------------------------------------------------

    def visit_BinaryOperation(self, node: cst.BinaryOperation) -> None:
        new_type = ARITH.get(type(node.operator))
        if new_type is not None:
            new = node.with_changes(operator=_same_spacing(node.operator, new_type))
            self.add("arith", node, new, f"{_op_text(node.operator)} -> {_op_text(new.operator)}")

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        new_type = AUG.get(type(node.operator))
        if new_type is not None:
            new = node.with_changes(operator=_same_spacing(node.operator, new_type))
            self.add("arith", node, new, f"{_op_text(node.operator)} -> {_op_text(new.operator)}")

    def visit_UnaryOperation(self, node: cst.UnaryOperation) -> None:
        if isinstance(node.operator, cst.Minus | cst.Not) and id(node) not in self.handled:
            new = node.expression
            if node.lpar:
                new = new.with_changes(lpar=node.lpar, rpar=node.rpar)
            self.add("unary", node, new, f"{_op_text(node.operator)} removed")

    def visit_Comparison(self, node: cst.Comparison) -> None:
        for index, target in enumerate(node.comparisons):
            new_type = COMPARE.get(type(target.operator))
            if new_type is None:
                continue
            targets = list(node.comparisons)
            targets[index] = target.with_changes(operator=_same_spacing(target.operator, new_type))
            new = node.with_changes(comparisons=targets)
            self.add(
                "compare", node, new, f"{_op_text(target.operator)} -> {_op_text(targets[index].operator)}"
            )

    def visit_BooleanOperation(self, node: cst.BooleanOperation) -> None:
        new = node.with_changes(operator=_same_spacing(node.operator, BOOLOP[type(node.operator)]))
        self.add("boolop", node, new, f"{_op_text(node.operator)} -> {_op_text(new.operator)}")

    def visit_Name(self, node: cst.Name) -> None:
        if node.value in ("True", "False") and id(node) not in self.handled:
            flipped = "False" if node.value == "True" else "True"
            self.add("bool", node, node.with_changes(value=flipped), f"{node.value} -> {flipped}")

    def visit_Integer(self, node: cst.Integer) -> None:
        if id(node) not in self.handled:
            value = int(node.evaluated_value)
            self.add("const", node, _int_node(value + 1, node), f"{node.value} -> {value + 1}")

    def visit_Float(self, node: cst.Float) -> None:
        if id(node) not in self.handled:
            value = float(node.evaluated_value)
            new_value = repr(value * 2 if value else 1.0)
            self.add("const", node, node.with_changes(value=new_value), f"{node.value} -> {new_value}")

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        if self.functions == 0 or _is_docstring(node) or any(_is_quiet(s) for s in node.body):
            return
        kinds = (cst.Assign, cst.AugAssign, cst.AnnAssign, cst.Expr)
        if all(isinstance(statement, kinds) for statement in node.body):
            if any(isinstance(s, cst.AnnAssign) and s.value is None for s in node.body):
                return
            new = node.with_changes(body=[cst.Pass()])
            text = "; ".join(_code(statement).strip() for statement in node.body).splitlines()[0]
            self.add("stmt", node, new, f"removed: {text[:60]}")

    # -- calls ---------------------------------------------------------------

    def _nf_call(self, call: cst.Call) -> None:
        kernel = _callee_name(call)
        for index, arg in enumerate(call.args):
            label = arg.keyword.value if arg.keyword else f"#{index}"
            kept = [a for i, a in enumerate(call.args) if i != index]
            self.add("nf-drop", call, call.with_changes(args=kept), f"NF.{kernel}: {label} dropped")
            if isinstance(arg.value, cst.Name) and arg.value.value in ("True", "False") and arg.keyword:
                self.handled.add(id(arg.value))
                flipped = "False" if arg.value.value == "True" else "True"
                new_arg = arg.with_changes(value=arg.value.with_changes(value=flipped))
                args = [new_arg if i == index else a for i, a in enumerate(call.args)]
                self.add("nf-option", call, call.with_changes(args=args), f"NF.{kernel}: {label}={flipped}")
        for index in range(len(call.args) - 1):
            first, second = call.args[index], call.args[index + 1]
            if first.star or second.star or _same_code(first.value, second.value):
                continue
            args = list(call.args)
            args[index] = first.with_changes(value=second.value)
            args[index + 1] = second.with_changes(value=first.value)
            labels = [
                a.keyword.value if a.keyword else f"#{i}" for i, a in ((index, first), (index + 1, second))
            ]
            self.add(
                "nf-swap", call, call.with_changes(args=args), f"NF.{kernel}: {labels[0]} <-> {labels[1]}"
            )

    def _dims(self, call: cst.Call) -> None:
        name = _callee_name(call)
        for index, arg in enumerate(call.args):
            is_dim = (arg.keyword and arg.keyword.value == "dim") or (
                arg.keyword is None and name in DIM_CALLS and not arg.star
            )
            value = _int_value(arg.value) if is_dim else None
            if value is None:
                continue
            self._own(arg.value)
            args = list(call.args)
            args[index] = arg.with_changes(value=_int_node(_shifted(value), arg.value))
            label = "dim" if arg.keyword else f"#{index}"
            self.add(
                "dim", call, call.with_changes(args=args), f"{name}: {label} {value} -> {_shifted(value)}"
            )
        if name in ORDERLESS_PAIRS and len(call.args) == 2 and not any(a.keyword for a in call.args):
            first, second = call.args
            args = [first.with_changes(value=second.value), second.with_changes(value=first.value)]
            self.add("dim", call, call.with_changes(args=args), f"{name}: dimensions swapped")

    def _own(self, node: cst.CSTNode) -> None:
        """Leave ``node`` (a dimension literal) to the ``dim`` operator."""
        self.handled.add(id(node))
        if isinstance(node, cst.UnaryOperation):
            self.handled.add(id(node.expression))


def _code(node: cst.CSTNode) -> str:
    return cst.Module([]).code_for_node(node)


def _same_code(a: cst.CSTNode, b: cst.CSTNode) -> bool:
    return _code(a) == _code(b)


@dataclass
class ParsedModule:
    """A module's code and its mutants."""

    code: str
    mutants: list[Mutant]

    def __post_init__(self) -> None:
        self.line_starts = [0]
        for line in self.code.splitlines(keepends=True):
            self.line_starts.append(self.line_starts[-1] + len(line))

    def offset(self, line: int, column: int) -> int:
        return self.line_starts[line - 1] + column

    def mutated(self, mutant: Mutant) -> str:
        """The module's code with the mutant's span replaced (a line
        continued inside brackets may lose its indentation: Python ignores it
        there)."""
        start, end = self.offset(mutant.line, mutant.column), self.offset(mutant.end_line, mutant.end_column)
        return self.code[:start] + mutant.replacement + self.code[end:]


def parse_mutants(code: str, keep: Callable[[Mutant], bool] = lambda _m: True) -> ParsedModule:
    """Every mutant of ``code`` that ``keep`` accepts, in source order."""
    wrapper = MetadataWrapper(cst.parse_module(code))
    sites = _Sites()
    wrapper.visit(sites)
    found = [m for m in sites.found if keep(m)]
    found.sort(key=lambda m: (m.line, m.column, m.operator, m.description))
    return ParsedModule(code, _unique(found))


def _unique(found: list[Mutant]) -> list[Mutant]:
    """Mutants with distinct keys (a repeated key gets a numeric suffix)."""
    seen: dict[str, int] = {}
    unique = []
    for mutant in found:
        count = seen.get(mutant.key, 0)
        seen[mutant.key] = count + 1
        if count:
            mutant = Mutant(**{**mutant.__dict__, "description": f"{mutant.description} ({count + 1})"})
        unique.append(mutant)
    return unique


ANY = object()  # a declared default of a hint: any value computes the same
POSITIONAL = "*positional"  # defaults[kernel][POSITIONAL]: its positional-or-keyword parameters, in order
# defaults[IMPORTABLE]: module name -> (module, exported names or None for all): what a port's
# ``from <module> import <name>`` binds (the stand-in's modules), to read an enum member
# argument (``Mode.MEMBER``) as the member it names
IMPORTABLE = "*importable"


class _Canonical(ast.NodeTransformer):
    """The orderless argument pairs (``transpose(a, b)``) sorted; keyword
    arguments of ``NF`` kernel calls that pass the kernel's declared default
    (or are performance hints) dropped."""

    def __init__(self, defaults: dict[str, dict[str, object]], imported: dict[str, object]) -> None:
        self.defaults = defaults
        self.imported = imported

    def visit_Call(self, node: ast.Call) -> ast.Call:
        self.generic_visit(node)
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if name in ORDERLESS_PAIRS and len(node.args) == 2 and not node.keywords:
            node.args.sort(key=ast.dump)
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "NF":
            declared = self.defaults.get(func.attr, {})
            _keywords_for_positions(node, declared.get(POSITIONAL, ()))
            node.keywords = [k for k in node.keywords if not _passes_default(k, declared, self.imported)]
        return node


def _keywords_for_positions(node: ast.Call, order: object) -> None:
    """Positional arguments given as keywords (``order``: the kernel's
    positional-or-keyword parameters, in order), so that a trailing one that
    passes its declared default is dropped like a keyword."""
    if not isinstance(order, tuple) or any(isinstance(a, ast.Starred) for a in node.args):
        return
    if len(node.args) > len(order):
        return
    named = {k.arg for k in node.keywords}
    if named & set(order[: len(node.args)]):
        return
    moved = [ast.keyword(arg=name, value=value) for name, value in zip(order, node.args, strict=False)]
    node.args, node.keywords = [], moved + node.keywords


def _passes_default(keyword: ast.keyword, declared: dict[str, object], imported: dict[str, object]) -> bool:
    if keyword.arg not in declared:
        return False
    default = declared[keyword.arg]
    if default is ANY:
        return True
    if isinstance(default, enum.Enum) and isinstance(keyword.value, ast.Attribute):
        return _names_member(keyword.value, default, imported)
    if not isinstance(keyword.value, ast.Constant):
        return False
    value = keyword.value.value
    if default is None or isinstance(default, bool) or isinstance(value, bool):
        return value is default
    return isinstance(default, int | float) and isinstance(value, int | float) and value == default


def _names_member(value: ast.expr, member: enum.Enum, imported: dict[str, object]) -> bool:
    """Whether ``value`` is ``Name.MEMBER`` naming ``member``: ``Name`` bound once in the
    module, by a ``from`` import of the enum class ``member`` belongs to."""
    if not (isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name)):
        return False
    owner = imported.get(value.value.id)
    return owner is type(member) and type(member).__members__.get(value.attr) is member


def _imported_classes(tree: ast.Module, importable: object) -> dict[str, object]:
    """Local name -> the object a module-level ``from M import N [as A]`` binds, when M is
    one of ``importable``'s modules that exports N and A is bound nowhere else in the module."""
    if not isinstance(importable, dict):
        return {}
    found: dict[str, object] = {}
    for node in tree.body:
        if not isinstance(node, ast.ImportFrom) or node.level or node.module not in importable:
            continue
        module, names = importable[node.module]
        for alias in node.names:
            if module is not None and (names is None or alias.name in names) and hasattr(module, alias.name):
                found[alias.asname or alias.name] = getattr(module, alias.name)
    bindings = Counter(_bound_names(tree))
    return {name: value for name, value in found.items() if bindings[name] == 1}


def _bound_names(tree: ast.Module) -> list[str]:
    """Every name a binding in the module binds (imports, assignments, definitions, targets...),
    once per binding, at any depth."""
    bound: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store | ast.Del):
            bound.append(node.id)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            bound += [(a.asname or a.name).split(".")[0] for a in node.names]
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            bound.append(node.name)
        elif isinstance(node, ast.arg):
            bound.append(node.arg)
        elif isinstance(node, ast.Global | ast.Nonlocal):
            bound += node.names
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.append(node.name)
        elif isinstance(node, ast.MatchAs | ast.MatchStar) and node.name:
            bound.append(node.name)
        elif isinstance(node, ast.MatchMapping) and node.rest:
            bound.append(node.rest)
    return bound


def normalised(code: str, defaults: dict[str, dict[str, object]] | None = None) -> str:
    """A canonical form of a module: two modules with the same form compute
    the same. Positions, formatting and comments are dropped; the two
    dimensions of ``transpose`` and ``swapaxes`` are put in a fixed order;
    a keyword argument of an ``NF.<kernel>`` call is dropped when ``defaults``
    (kernel -> parameter -> declared default, ``ANY`` for a hint) says the
    kernel takes that value when the argument is left out (an enum member
    given as ``Name.MEMBER``, ``Name`` imported from a module of
    ``defaults[IMPORTABLE]`` and bound nowhere else, compares as that member)."""
    tree = ast.parse(code)
    imported = _imported_classes(tree, (defaults or {}).get(IMPORTABLE))
    return ast.dump(_Canonical(defaults or {}, imported).visit(tree))
