"""Weight loaders changed where model code builds them.

``LoaderEdits`` changes the loaders ``autoport_cst.transform.anatomy.loaders``
found: in place when every parameter sharing a built loader gets the same
change; otherwise it *splits*: each parameter that changes gets its own
loader expression (the chain inlined around the new base), the others keep
the shared local, and locals no parameter reads any more are removed. New
loader expressions are rendered in the layout of the code around them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import libcst as cst

from autoport_cst.transform.anatomy.loaders import (
    RANK_WRAPPERS,
    Loader,
    Placed,
    bound_names,
    find_loaders,
    first_line,
    loader_helpers,
    param_key,
    placed_statements,
    plain_binding,
)
from autoport_cst.transform.base import FileContext
from autoport_cst.transform.cst.snippets import parse_statement
from autoport_cst.transform.cst.vocabulary import (
    code_of,
    dotted,
    walk,
)

LINE_WIDTH = 100


INDENT = "    "


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

    Errors are positioned precondition errors naming the codemod at work
    (``ctx.refuse``)."""

    def __init__(self, module: cst.Module, ctx: FileContext, scope: cst.CSTNode, owner: str = "") -> None:
        self.scope = scope
        self.module = module
        self.ctx = ctx
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
                    f"; it hands self to {', '.join(sorted({first_line(h.func) for h in helpers}))}(...), "
                    "which may attach it out of sight"
                )
            raise self.ctx.refuse(
                f"{self.owner} attaches no loader to self.{key} "
                f"(no set_weight_loader(self.{key}, ...) in the class{hint})",
                self.scope,
                self.module,
            )
        for loader in loaders:
            if loader.problem is not None:
                raise self.ctx.refuse(
                    f"cannot read the loader of self.{key} in {self.owner} "
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
            raise self.ctx.refuse(
                f"the loader of self.{loader.key} in {self.owner} is wrapped in "
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
                        raise self.ctx.refuse(
                            f"the loader of self.{loader.key} reads `{other}`, which is "
                            f"rebound at `{first_line(p.stmt)}` before the new loader would be attached",
                            p.stmt,
                            self.module,
                        )

    # -- edits ----------------------------------------------------------------------

    def edits(self) -> dict:
        """The gathered changes as ``rewrite`` edits."""
        from autoport_cst.transform.edit.tree import add_edit

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
        from autoport_cst.transform.edit.tree import removal_edits

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
                elements = [e for e in params.elements if param_key(e.value) not in gone]
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


# the loaders that take is_storage_transposed (checkpoint tensors stored [in, out] or [out, in])
TRANSPOSING_LOADERS = (
    "sharding_weight_loader",
    "sharding_weight_loader_with_padding",
    "fused_qkv_weight_loader",
    "fused_qkv_split_loader",
    "fused_part_loader",
)


def not_transposed(call: cst.Call) -> cst.Call:
    """A loader call with ``is_storage_transposed=False``."""
    return call.with_changes(
        args=[
            a.with_changes(value=cst.Name("False"))
            if a.keyword is not None and a.keyword.value == "is_storage_transposed"
            else a
            for a in call.args
        ]
    )
