"""Weight loaders where model code builds them, and the MLP classes that use them.

``set_weight_loader(self.<x>, <loader>)`` attaches a loader to a parameter.
The loader expression is often not the loader call itself: a local variable
bound before (``gate_up_loader = sharding_weight_loader(...)``), rebound
through wrappers (``gate_up_loader = with_rank_override(gate_up_loader,
rank=self.mlp_tp_rank)``) and passed to several parameters.

``find_loaders`` resolves each attachment back to its *base* loader call
(the innermost call, whose name contains ``loader``) and the *wrappers*
around it (calls whose first argument is a loader), through the local
assignments in between; what it cannot resolve it describes (``problem``).
``LoaderEdits`` changes loaders where they are built: in place when every
parameter sharing a built loader gets the same change; otherwise it
*splits*: each parameter that changes gets its own loader expression (the
chain inlined around the new base), the others keep the shared local, and
locals no parameter reads any more are removed.

The guards of quantized classes (``autoport_cst.transform.guards``) and the
dense MLP classes (``autoport_cst.transform.mlp_classes``) are re-exported
here for the codemods that import them from this module.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import libcst as cst

from autoport_cst.transform.base import FileContext
from autoport_cst.transform.cst_helpers import (
    code_of,
    dotted,
    keyword_arg,
    parse_statement,
    positional_args,
    walk,
)
from autoport_cst.transform.guards import declare_guarded, guard_edit, is_quantized  # noqa: F401 (re-exported)
from autoport_cst.transform.mlp_classes import (  # noqa: F401 (re-exported)
    MLP_CALLS,
    TORCH_MLP,
    MlpClass,
    mlp_classes,
    mlp_mapping_weights,
)
from autoport_cst.transform.vocabulary import nodes_of

SET_WEIGHT_LOADER = "set_weight_loader"
# Wrappers that only choose the rank a loader reads for: a new loader of a
# sibling tensor (the bias of a weight) is wrapped the same way.
RANK_WRAPPERS = ("with_rank_override",)
LINE_WIDTH = 100
INDENT = "    "

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


def _first_line(node: cst.CSTNode) -> str:
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
        text = f"set_weight_loader(self.{self.key}, {_first_line(self.argument)})"
        for binding in self.bindings:
            text += f", where {_first_line(binding.stmt)}"
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
            return None, f"`{name}` is bound by `{_first_line(last.stmt)}`, not by a plain assignment"
        if last.blocks != at.blocks[: len(last.blocks)]:
            return (
                None,
                f"`{name}` is assigned conditionally (`{_first_line(last.stmt)}`, in a block apart from its use)",
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
            problem=f"`{_first_line(expr)}` is not a loader call (a call named *loader*), a wrapper of one, "
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


def _param_key(node: cst.CSTNode) -> str | None:
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
    keys = [_param_key(e.value) for e in loop.iter.elements]
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
            keys: list[str | None] = [_param_key(param)]
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


# -- rendering loader expressions -----------------------------------------------------------------


def _arg_code(arg: cst.Arg) -> str:
    value = code_of(arg.value).strip()
    star = arg.star if isinstance(arg.star, str) else ""
    return f"{arg.keyword.value}={value}" if arg.keyword is not None else f"{star}{value}"


def render_call(func: str, args: list[str], level: int) -> str:
    """``func(a, b)`` on one line when it fits, else one argument per line;
    continuation lines indented ``level`` steps."""
    flat = f"{func}({', '.join(args)})"
    if len(INDENT * level) + len(flat) <= LINE_WIDTH and "\n" not in flat:
        return flat
    inner = INDENT * (level + 1)
    lines = "".join(f"{inner}{a},\n" for a in args)
    return f"{func}(\n{lines}{INDENT * level})"


def render_loader(base: str, wrappers: tuple[cst.Call, ...], level: int = 1) -> str:
    """``base`` inside ``wrappers`` (outermost first), each wrapper keeping
    its other arguments."""
    if not wrappers:
        return base
    outer, rest = wrappers[0], wrappers[1:]
    others = [_arg_code(a) for a in outer.args[1:]]
    inner = render_loader(base, rest, level + 1)
    func = code_of(outer.func)
    return render_call(func, [inner, *others], level) if "\n" in inner or others else f"{func}({inner})"


def render_base(call: cst.Call, level: int) -> str:
    return render_call(code_of(call.func), [_arg_code(a) for a in call.args], level)


def attach_statement(key: str, loader_code: str, module: cst.Module) -> cst.BaseStatement:
    """``set_weight_loader(self.<key>, <loader>)`` over several lines."""
    return parse_statement(f"set_weight_loader(\n{INDENT}self.{key},\n{INDENT}{loader_code},\n)", module)


# -- editing loaders ----------------------------------------------------------------------------


class LoaderEdits:
    """Changes to the loaders attached under ``scope`` (a class), gathered,
    then turned into ``rewrite`` edits by :meth:`edits`.

    Errors are positioned precondition errors of ``codemod_id``."""

    def __init__(
        self, scope: cst.CSTNode, module: cst.Module, ctx: FileContext, codemod_id: str, owner: str = ""
    ) -> None:
        self.scope = scope
        self.module = module
        self.ctx = ctx
        self.codemod_id = codemod_id
        self.owner = owner or (scope.name.value if isinstance(scope, cst.ClassDef) else "this file")
        self.found = find_loaders(scope)
        self._new_base: dict[str, Callable[[cst.Call], cst.Call]] = {}
        self._removed: set[str] = set()
        self._after: dict[int, list[cst.BaseStatement]] = {}
        self._doomed: list[cst.CSTNode] = []

    # -- reading ------------------------------------------------------------------

    def of(self, key: str) -> list[Loader]:
        return self.found.get(key, [])

    def require(self, key: str) -> list[Loader]:
        """The attachments of ``self.<key>``, each resolved to its base
        loader call; a precondition error naming what was found otherwise."""
        loaders = self.of(key)
        if not loaders:
            helpers = loader_helpers(self.scope) if isinstance(self.scope, cst.ClassDef) else []
            hint = ""
            if helpers:
                hint = (
                    f"; it hands self to {', '.join(sorted({_first_line(h.func) for h in helpers}))}(...), "
                    "which may attach it out of sight"
                )
            raise self.ctx.precondition(
                f"{self.codemod_id}: {self.owner} attaches no loader to self.{key} "
                f"(no set_weight_loader(self.{key}, ...) in the class{hint})",
                self.scope,
                self.module,
            )
        for loader in loaders:
            if loader.problem is not None:
                raise self.ctx.precondition(
                    f"{self.codemod_id}: cannot read the loader of self.{key} in {self.owner} "
                    f"({loader.describe()}): {loader.problem}",
                    loader.problem_node or loader.statement,
                    self.module,
                )
        return loaders

    def base_name(self, key: str) -> str | None:
        """The name of the base loader call of ``key`` (one for every attachment), or None."""
        names = {dotted(loader.base.func) for loader in self.require(key) if loader.base is not None}
        return names.pop() if len(names) == 1 else None

    # -- changes --------------------------------------------------------------------

    def replace_base(self, key: str, fn: Callable[[cst.Call], cst.Call]) -> None:
        """Build ``key``'s loader from ``fn(base call)`` instead."""
        self.require(key)
        self._new_base[key] = fn

    def remove(self, key: str) -> None:
        """Stop attaching a loader to ``key`` (its parameter goes), whatever
        the loader is."""
        if not self.of(key):
            self.require(key)
        self._removed.add(key)

    def doom(self, statement: cst.CSTNode) -> None:
        """Remove another statement of the scope with the loaders' own
        removals (comments above removed statements move down together)."""
        self._doomed.append(statement)

    def add_after(self, loader: Loader, statements: list[cst.BaseStatement]) -> None:
        """Insert ``statements`` after the attachment ``loader`` (after its loop)."""
        self._after.setdefault(id(loader.statement), []).extend(statements)

    def sibling_loader(self, loader: Loader, base_code: str, at: Loader | None = None) -> str:
        """Code of a loader for a sibling tensor of ``loader``'s parameter
        (its bias): ``base_code`` inside ``loader``'s rank wrappers, for a
        statement placed right after ``at``'s attachment (default: the same).
        A wrapper that does more than choose a rank is a precondition error."""
        others = [name for name in loader.wrapper_names() if name.rsplit(".", 1)[-1] not in RANK_WRAPPERS]
        if others:
            raise self.ctx.precondition(
                f"{self.codemod_id}: the loader of self.{loader.key} in {self.owner} is wrapped in "
                f"{', '.join(others)}(...) ({loader.describe()}); a loader for a sibling tensor cannot be "
                f"derived from it (only {', '.join(RANK_WRAPPERS)} is carried over)",
                loader.wrappers[0],
                self.module,
            )
        self._check_names(loader, _wrapper_args(loader), at or loader)
        return render_loader(base_code, loader.wrappers)

    def _check_names(self, loader: Loader, nodes: list[cst.CSTNode], at: Loader) -> None:
        """The names that ``nodes`` (parts of ``loader``'s chain) read must
        mean the same right after ``at``'s attachment."""
        placed = placed_statements(loader.function)
        where = {id(p.stmt): p for p in placed}
        sources = [b for b in loader.bindings] + [loader.placed]
        start = min(p.index for p in sources)
        end = where[id(at.placed.stmt)].index if id(at.placed.stmt) in where else loader.placed.index
        for node in nodes:
            for other in _read_names(node) - {"self"}:
                for p in placed[start + 1 : end + 1]:
                    if other in bound_names(p.stmt) and id(p.stmt) not in {
                        id(b.stmt) for b in loader.bindings
                    }:
                        raise self.ctx.precondition(
                            f"{self.codemod_id}: the loader of self.{loader.key} reads `{other}`, which is "
                            f"rebound at `{_first_line(p.stmt)}` before the new loader would be attached",
                            p.stmt,
                            self.module,
                        )

    # -- edits ----------------------------------------------------------------------

    def edits(self) -> dict:
        """The gathered changes as ``rewrite`` edits."""
        from autoport_cst.transform.layers import add_edit

        edits: dict = {}
        split: dict[int, str] = {}  # id(loader) -> its new argument code
        for users in self._users_by_base().values():
            changed = [u for u in users if u.key in self._new_base and u.key not in self._removed]
            if not changed:
                continue
            base = changed[0].base
            assert base is not None  # users grouped by their base
            new = {id(u): self._new_base[u.key](base) for u in changed}
            live = [u for u in users if u.key not in self._removed]
            if len(changed) == len(live) and len({code_of(n) for n in new.values()}) == 1:
                fn = self._new_base[changed[0].key]
                add_edit(edits, id(base), lambda updated, fn=fn: fn(updated))
                continue
            for user in changed:
                split[id(user)] = self._inline(user, new[id(user)])
        statements = self._statement_edits(split)
        for key, fn in statements.items():
            add_edit(edits, key, fn)
        for key, added in self._after.items():
            _compose(edits, key, _then_insert(added))
        return edits

    def _all(self) -> Iterator[Loader]:
        for loaders in self.found.values():
            yield from loaders

    def _users_by_base(self) -> dict[int, list[Loader]]:
        users: dict[int, list[Loader]] = {}
        for loader in self._all():
            if loader.base is not None:
                users.setdefault(id(loader.base), []).append(loader)
        return users

    def _inline(self, loader: Loader, new_base: cst.Call) -> str:
        """The loader expression of ``loader`` with its chain written out
        around ``new_base``."""
        if loader.direct:
            return code_of(new_base)
        self._check_names(loader, [*_wrapper_args(loader), *(a.value for a in new_base.args)], loader)
        return render_loader(render_base(new_base, len(loader.wrappers) + 1), loader.wrappers)

    def _statement_edits(self, split: dict[int, str]) -> dict:
        """Edits of the attaching statements: removed, rebuilt when split,
        loops unrolled or shortened."""
        from autoport_cst.transform.layers import removal_edits

        edits: dict = {}
        doomed: list[cst.CSTNode] = list(self._doomed) + self._dead_bindings(split)
        loops: dict[int, list[Loader]] = {}
        for loader in self._all():
            if loader.in_loop:
                loops.setdefault(id(loader.statement), []).append(loader)
            elif loader.key in self._removed:
                doomed.append(loader.statement)
            elif id(loader) in split:
                stmt = attach_statement(loader.key, split[id(loader)], self.module)
                edits[id(loader.statement)] = lambda updated, stmt=stmt: stmt.with_changes(
                    leading_lines=updated.leading_lines
                )
        for members in loops.values():
            if all(m.key in self._removed for m in members):
                doomed.append(members[0].statement)
                continue
            edit = self._loop_edit(members, split)
            if edit is not None:
                edits[id(members[0].statement)] = edit
        doomed = with_emptied_blocks(self.scope, doomed)
        for key, fn in removal_edits(self.scope, doomed).items() if doomed else ():
            _compose(edits, key, fn)
        return edits

    def _loop_edit(self, members: list[Loader], split: dict[int, str]):
        kept = [m for m in members if m.key not in self._removed]
        if len(kept) == len(members) and not any(id(m) in split for m in members):
            return None
        if len(kept) > 1 and not any(id(m) in split for m in kept):
            gone = {m.key for m in members} - {m.key for m in kept}

            def shorten(updated: cst.For) -> cst.For:
                params = updated.iter
                assert isinstance(params, (cst.Tuple, cst.List))  # as _loop_keys accepted it
                elements = [e for e in params.elements if _param_key(e.value) not in gone]
                elements[-1] = elements[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
                return updated.with_changes(iter=params.with_changes(elements=elements))

            return shorten

        def unroll(updated: cst.For):
            inner = _loop_call(updated)  # set_weight_loader(w, <loader>)
            current = code_of(inner.args[1].value)
            statements = [attach_statement(m.key, split.get(id(m), current), self.module) for m in kept]
            statements[0] = statements[0].with_changes(leading_lines=updated.leading_lines)
            return statements[0] if len(statements) == 1 else cst.FlattenSentinel(statements)

        return unroll

    def _dead_bindings(self, split: dict[int, str]) -> list[cst.CSTNode]:
        """The local assignments of changed chains that nothing reads any
        more (of those that were read before)."""
        gone_statements: set[int] = set()
        for loader in self._all():
            removed = loader.key in self._removed
            if loader.in_loop:
                members = [m for m in self._all() if m.statement is loader.statement]
                if all(m.key in self._removed or id(m) in split for m in members):
                    gone_statements.add(id(loader.placed.stmt))
            elif removed or id(loader) in split:
                gone_statements.add(id(loader.placed.stmt))
        candidates: dict[int, tuple[Loader, Placed]] = {}
        for loader in self._all():
            if id(loader.placed.stmt) in gone_statements:
                for binding in loader.bindings:
                    candidates[id(binding.stmt)] = (loader, binding)
        dead: set[int] = set()
        changed = True
        while changed:
            changed = False
            for key, (loader, binding) in candidates.items():
                if key in dead:
                    continue
                readers = _readers(loader.function, binding)
                if readers and all(id(r) in gone_statements or id(r) in dead for r in readers):
                    dead.add(key)
                    changed = True
        return [binding.stmt for key, (loader, binding) in candidates.items() if key in dead]


def _compose(edits: dict, key: int, fn) -> None:
    """Register ``fn`` for node ``key`` after an edit already there, whatever
    that one returns."""
    previous = edits.get(key)
    edits[key] = fn if previous is None else (lambda updated, first=previous: fn(first(updated)))


def with_emptied_blocks(root: cst.CSTNode, doomed: list[cst.CSTNode]) -> list[cst.CSTNode]:
    """``doomed`` statements, with each compound statement (``for``, ``if``
    without ``else``, ``with``) whose body they would empty in their place."""
    gone = {id(s) for s in doomed}
    changed = True
    while changed:
        changed = False
        for node in walk(root):
            if id(node) in gone or not isinstance(node, (cst.For, cst.If, cst.With, cst.While)):
                continue
            if getattr(node, "orelse", None) is not None:
                continue
            body = node.body.body if isinstance(node.body, cst.IndentedBlock) else []
            if body and all(id(s) in gone for s in body):
                gone -= {id(s) for s in body}
                gone.add(id(node))
                doomed = [s for s in doomed if id(s) not in {id(b) for b in body}] + [node]
                changed = True
    return doomed


def _loop_call(loop: cst.For) -> cst.Call:
    """The ``set_weight_loader`` call of a loop that ``_loop_keys`` accepted."""
    line = loop.body.body[0]
    assert isinstance(line, cst.SimpleStatementLine) and isinstance(line.body[0], cst.Expr)
    call = line.body[0].value
    assert isinstance(call, cst.Call)
    return call


def _wrapper_args(loader: Loader) -> list[cst.CSTNode]:
    """The arguments of ``loader``'s wrappers besides the loader they wrap."""
    return [a.value for w in loader.wrappers for a in w.args[1:]]


def _then_insert(new: list[cst.BaseStatement]):
    """An edit appending ``new`` after a statement, also after one an earlier
    edit turned into several."""

    def edit(updated):
        if isinstance(updated, cst.FlattenSentinel):
            return cst.FlattenSentinel([*updated.nodes, *new])
        return cst.FlattenSentinel([updated, *new])

    return edit


def _read_names(node: cst.CSTNode) -> set[str]:
    """Variable names read under ``node`` (attribute and keyword names excluded)."""
    skip: set[int] = set()
    names: set[str] = set()
    for n in walk(node):
        if isinstance(n, cst.Attribute):
            skip.add(id(n.attr))
        elif isinstance(n, cst.Arg) and n.keyword is not None:
            skip.add(id(n.keyword))
        elif isinstance(n, cst.Name) and id(n) not in skip:
            names.add(n.value)
    return names


def _header(stmt: cst.CSTNode) -> list[cst.CSTNode]:
    """The parts of a statement evaluated by the statement itself (not its body)."""
    if isinstance(stmt, (cst.SimpleStatementLine, cst.SimpleStatementSuite)):
        return [stmt]
    if isinstance(stmt, cst.For):
        return [stmt.iter]
    if isinstance(stmt, (cst.If, cst.While)):
        return [stmt.test]
    if isinstance(stmt, cst.With):
        return [item.item for item in stmt.items]
    return []


def _readers(func: cst.FunctionDef, binding: Placed) -> list[cst.CSTNode]:
    """Statements that read the value ``binding`` gives its name: up to the
    next binding of the name (whose right-hand side counts)."""
    name = next(iter(bound_names(binding.stmt)))
    readers: list[cst.CSTNode] = []
    for placed in placed_statements(func)[binding.index + 1 :]:
        rebinds = name in bound_names(placed.stmt)
        value = plain_binding(placed.stmt, name) if rebinds else None
        parts = [value] if value is not None else ([] if rebinds else _header(placed.stmt))
        if any(name in _read_names(part) for part in parts):
            readers.append(placed.stmt)
        if rebinds:
            break
    return readers
