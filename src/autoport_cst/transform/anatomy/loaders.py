"""Weight loaders where model code builds them: each ``set_weight_loader``
call of a parameter, the loader expression behind it through locals, rebindings
and wrappers, and the statements of a method in source order."""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from autoport_cst.transform.cst.vocabulary import (
    code_of,
    dotted,
    keyword_arg,
    nodes_of,
    positional_args,
    walk,
)

SET_WEIGHT_LOADER = "set_weight_loader"


# Wrappers that only choose the rank a loader reads for: a new loader of a
# sibling tensor (the bias of a weight) is wrapped the same way.
RANK_WRAPPERS = ("with_rank_override",)

# -- statements in source order --------------------------------------------------------------


@dataclass(frozen=True)
class Placed:
    """A statement of a function, its rank in source order and the blocks
    (ids of the suites) that enclose it, outermost first."""

    stmt: cst.CSTNode
    index: int
    blocks: tuple[int, ...]


def _suites(stmt: cst.CSTNode) -> list[cst.BaseSuite]:
    """The blocks of a compound statement, every branch."""
    if isinstance(stmt, cst.If):
        out = [stmt.body]
        orelse = stmt.orelse
        while orelse is not None:
            out.append(orelse.body)
            orelse = orelse.orelse if isinstance(orelse, cst.If) else None
        return out
    if isinstance(stmt, (cst.For, cst.While)):
        return [stmt.body] + ([stmt.orelse.body] if stmt.orelse is not None else [])
    if isinstance(stmt, cst.With):
        return [stmt.body]
    if isinstance(stmt, (cst.Try, cst.TryStar)):
        out = [stmt.body] + [h.body for h in stmt.handlers]
        out += [s.body for s in (stmt.orelse, stmt.finalbody) if s is not None]
        return out
    return []


def placed_statements(func: cst.FunctionDef) -> list[Placed]:
    """Every statement of ``func`` in source order (compound statements
    before their bodies), nested functions and classes excluded."""
    out: list[Placed] = []

    def visit(suite: cst.BaseSuite, blocks: tuple[int, ...]) -> None:
        blocks = blocks + (id(suite),)
        body = suite.body if isinstance(suite, cst.IndentedBlock) else [suite]
        for stmt in body:
            out.append(Placed(stmt, len(out), blocks))
            if not isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
                for inner in _suites(stmt):
                    visit(inner, blocks)

    visit(func.body, ())
    return out


def _target_names(target: cst.CSTNode) -> set[str]:
    return (
        {n.value for n in walk(target) if isinstance(n, cst.Name)}
        if not isinstance(target, cst.Attribute) and not isinstance(target, cst.Subscript)
        else set()
    )


def bound_names(stmt: cst.CSTNode) -> set[str]:
    """Local names a statement (re)binds: assignment targets, loop and
    ``with`` targets, names of nested definitions."""
    names: set[str] = set()
    if isinstance(stmt, (cst.SimpleStatementLine, cst.SimpleStatementSuite)):
        for small in stmt.body:
            if isinstance(small, cst.Assign):
                for target in small.targets:
                    names |= _target_names(target.target)
            elif isinstance(small, (cst.AugAssign, cst.AnnAssign)):
                names |= _target_names(small.target)
    elif isinstance(stmt, cst.For):
        names |= _target_names(stmt.target)
    elif isinstance(stmt, cst.With):
        for item in stmt.items:
            if item.asname is not None:
                names |= _target_names(item.asname.name)
    elif isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
        names.add(stmt.name.value)
    return names


def plain_binding(stmt: cst.CSTNode, name: str) -> cst.BaseExpression | None:
    """The value of ``name = value`` (one target, one statement on the line)."""
    if isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1:
        small = stmt.body[0]
        if isinstance(small, cst.Assign) and len(small.targets) == 1:
            target = small.targets[0].target
            if isinstance(target, cst.Name) and target.value == name:
                return small.value
        if (
            isinstance(small, cst.AnnAssign)
            and isinstance(small.target, cst.Name)
            and small.target.value == name
        ):
            return small.value
    return None


def first_line(node: cst.CSTNode) -> str:
    text = code_of(node).strip().splitlines()[0]
    return text if len(text) <= 80 else text[:77] + "..."


# -- finding loaders --------------------------------------------------------------------------


@dataclass
class Loader:
    """One attachment of a loader to a parameter, resolved to where the
    loader is built.

    ``key`` is the parameter path after ``self.`` (``gate_proj_weight``,
    ``lm_head.weight``); ``statement`` the ``set_weight_loader`` statement,
    or the ``for w in (self.a, self.b): set_weight_loader(w, ...)`` loop
    (``in_loop``); ``argument`` the loader expression it passes; ``base``
    the loader call it resolves to (None when ``problem`` says why not);
    ``wrappers`` the calls around it, outermost first; ``bindings`` the
    local assignments it went through, from the use back to the base."""

    key: str
    statement: cst.CSTNode
    call: cst.Call
    function: cst.FunctionDef
    placed: Placed
    argument: cst.BaseExpression
    base: cst.Call | None = None
    wrappers: tuple[cst.Call, ...] = ()
    bindings: tuple[Placed, ...] = ()
    in_loop: bool = False
    problem: str | None = None
    problem_node: cst.CSTNode | None = None

    # the names of the older LoaderSite
    @property
    def attr(self) -> str:
        return self.key

    @property
    def loader(self) -> cst.Call | None:
        return self.base

    @property
    def direct(self) -> bool:
        """The loader call is written in the attaching statement itself."""
        return not self.bindings and not self.wrappers and self.argument is self.base

    def wrapper_names(self) -> list[str]:
        return [dotted(w.func) or code_of(w.func) for w in self.wrappers]

    def describe(self) -> str:
        """``set_weight_loader(self.x, l)`` with ``l = with_rank_override(...)``..."""
        text = f"set_weight_loader(self.{self.key}, {first_line(self.argument)})"
        for binding in self.bindings:
            text += f", where {first_line(binding.stmt)}"
        return text


@dataclass
class _Chain:
    base: cst.Call | None = None
    wrappers: list[cst.Call] = field(default_factory=list)
    bindings: list[Placed] = field(default_factory=list)
    problem: str | None = None
    node: cst.CSTNode | None = None


def _is_loader_call(node: cst.CSTNode) -> bool:
    name = dotted(node.func) if isinstance(node, cst.Call) else None
    return name is not None and "loader" in name.rsplit(".", 1)[-1].lower()


class _Resolver:
    """Resolves loader expressions of one function."""

    def __init__(self, func: cst.FunctionDef) -> None:
        self.func = func
        self.placed = placed_statements(func)

    def binding(self, name: str, at: Placed) -> tuple[Placed | None, str | None]:
        before = [p for p in self.placed[: at.index] if name in bound_names(p.stmt)]
        params = {p.name.value for p in self.func.params.params}
        if not before:
            where = "a parameter of" if name in params else "not assigned before its use in"
            return None, f"the local `{name}` is {where} {self.func.name.value}"
        last = before[-1]
        if plain_binding(last.stmt, name) is None:
            return None, f"`{name}` is bound by `{first_line(last.stmt)}`, not by a plain assignment"
        if last.blocks != at.blocks[: len(last.blocks)]:
            return (
                None,
                f"`{name}` is assigned conditionally (`{first_line(last.stmt)}`, in a block apart from its use)",
            )
        return last, None

    def is_loader(self, expr: cst.CSTNode | None, at: Placed, depth: int = 0) -> bool:
        if depth > 20:
            return False
        if isinstance(expr, cst.Name):
            found, _ = self.binding(expr.value, at)
            return found is not None and self.is_loader(
                plain_binding(found.stmt, expr.value), found, depth + 1
            )
        if isinstance(expr, cst.Call):
            return _is_loader_call(expr) or self.is_wrapper(expr, at, depth + 1)
        return False

    def is_wrapper(self, call: cst.Call, at: Placed, depth: int = 0) -> bool:
        args = positional_args(call)
        return bool(args) and self.is_loader(args[0].value, at, depth + 1)

    def resolve(self, expr: cst.BaseExpression, at: Placed) -> _Chain:
        if isinstance(expr, cst.Name):
            found, problem = self.binding(expr.value, at)
            if found is None:
                return _Chain(problem=problem, node=expr)
            value = plain_binding(found.stmt, expr.value)
            assert value is not None  # binding() finds plain assignments
            chain = self.resolve(value, found)
            chain.bindings.insert(0, found)
            return chain
        if isinstance(expr, cst.Call) and self.is_wrapper(expr, at):
            chain = self.resolve(positional_args(expr)[0].value, at)
            chain.wrappers.insert(0, expr)
            return chain
        if isinstance(expr, cst.Call) and _is_loader_call(expr):
            return _Chain(base=expr)
        return _Chain(
            problem=f"`{first_line(expr)}` is not a loader call (a call named *loader*), a wrapper of one, "
            "or a local bound to one",
            node=expr,
        )


def _set_weight_loader_args(
    stmt: cst.CSTNode,
) -> tuple[cst.Call, cst.BaseExpression, cst.BaseExpression] | None:
    """(call, parameter, loader) of a ``set_weight_loader(param, loader)`` statement."""
    if not (isinstance(stmt, cst.SimpleStatementLine) and len(stmt.body) == 1):
        return None
    small = stmt.body[0]
    if not (isinstance(small, cst.Expr) and isinstance(small.value, cst.Call)):
        return None
    call = small.value
    if (dotted(call.func) or "").rsplit(".", 1)[-1] != SET_WEIGHT_LOADER:
        return None
    positional = [a.value for a in positional_args(call)]
    param = keyword_arg(call, "param")
    loader = keyword_arg(call, "loader") or keyword_arg(call, "weight_loader")
    values = positional + [a.value for a in (param, loader) if a is not None]
    if len(values) != 2:
        return None
    return call, values[0], values[1]


def param_key(node: cst.CSTNode) -> str | None:
    name = dotted(node)
    return name[len("self.") :] if name is not None and name.startswith("self.") else None


def _loop_keys(loop: cst.CSTNode, name: str) -> list[str] | None:
    """Parameters of ``for name in (self.a, self.b): <one statement>``."""
    if not (isinstance(loop, cst.For) and isinstance(loop.target, cst.Name) and loop.target.value == name):
        return None
    if not isinstance(loop.iter, (cst.Tuple, cst.List)):
        return None
    body = loop.body.body if isinstance(loop.body, cst.IndentedBlock) else []
    if len(body) != 1:
        return None
    keys = [param_key(e.value) for e in loop.iter.elements]
    return None if None in keys else [k for k in keys if k is not None]


def find_loaders(node: cst.CSTNode) -> dict[str, list[Loader]]:
    """``key -> attachments`` of every loader attached under ``node`` to a
    ``self.<key>`` parameter, in source order per function."""
    found: dict[str, list[Loader]] = {}
    for func in nodes_of(node, cst.FunctionDef):
        if not isinstance(func, cst.FunctionDef):
            continue
        resolver = _Resolver(func)
        by_id = {id(p.stmt): p for p in resolver.placed}
        for placed in resolver.placed:
            parts = _set_weight_loader_args(placed.stmt)
            if parts is None:
                continue
            call, param, argument = parts
            keys: list[str | None] = [param_key(param)]
            statement, in_loop = placed.stmt, False
            if keys[0] is None and isinstance(param, cst.Name):
                loop = _enclosing_loop(resolver.placed, placed)
                loop_keys = _loop_keys(loop.stmt, param.value) if loop is not None else None
                if loop is not None and loop_keys is not None:
                    keys = list(loop_keys)
                    statement, in_loop = loop.stmt, True
            chain = resolver.resolve(argument, placed)
            for key in keys:
                if key is None:
                    continue
                found.setdefault(key, []).append(
                    Loader(
                        key,
                        statement,
                        call,
                        func,
                        by_id[id(placed.stmt)],
                        argument,
                        chain.base,
                        tuple(chain.wrappers),
                        tuple(chain.bindings),
                        in_loop,
                        chain.problem,
                        chain.node,
                    )
                )
    return found


def _enclosing_loop(placed: list[Placed], inner: Placed) -> Placed | None:
    """The statement whose block holds ``inner``, when it is a ``for`` loop."""
    for candidate in reversed(placed[: inner.index]):
        if len(candidate.blocks) == len(inner.blocks) - 1:
            return candidate if isinstance(candidate.stmt, cst.For) else None
    return None


def loader_helpers(cls: cst.ClassDef) -> list[cst.Call]:
    """Calls in ``cls`` that hand ``self`` to a function (``attach_mlp_loaders(self,
    ...)``): loaders may be attached there, out of sight."""
    return [
        n
        for n in walk(cls)
        if isinstance(n, cst.Call)
        and any(isinstance(a.value, cst.Name) and a.value.value == "self" for a in n.args)
    ]
