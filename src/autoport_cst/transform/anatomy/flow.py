"""Data flow inside one function, path by path: what a site depends on.

A method is flattened into *items*: every simple statement, every compound
statement's header (``if``/``while`` test, ``for`` target and iterable,
``with`` items) and every nested ``def``, in source order, each with the
``if`` branches that enclose it. A *path* fixes the branch taken at some of
those ``if`` statements; along a path the items form a straight line, on
which reaching definitions are exact (loops are read as one pass).

Branches are named by the ``if``'s test (its code, and its rank among the
``if`` statements of the function with the same test), not by position, so a
codemod that inserts statements elsewhere does not rename them.
"""

from __future__ import annotations

from collections.abc import Iterator, Set
from dataclasses import dataclass, field

import libcst as cst

from autoport_cst.transform.cst.vocabulary import free_names, self_attr, walk

Branch = tuple[str, bool]  # (if key, taken)


@dataclass(frozen=True)
class Item:
    """One flattened statement (or compound header) of a function."""

    index: int
    node: cst.CSTNode  # the statement, or the header's expression(s)
    conditions: tuple[Branch, ...]  # enclosing if branches, outermost first
    defines: frozenset[str]
    uses: frozenset[str]
    header: str | None = None  # "if", "while", "for", "with" for compound headers


@dataclass
class FlatFunction:
    """A function flattened into items; ``if_keys`` maps each ``if`` node to its key."""

    func: cst.FunctionDef
    items: list[Item] = field(default_factory=list)
    if_tests: dict[str, cst.BaseExpression] = field(default_factory=dict)
    _by_node: dict[int, Item] | None = None
    _slices: dict[tuple[int, frozenset[str]], tuple[Item, ...]] = field(
        default_factory=dict, compare=False, repr=False
    )

    def item_of(self, node: cst.CSTNode) -> Item | None:
        """The innermost item whose node contains ``node``."""
        if self._by_node is None:
            self._by_node = {}
            for item in self.items:  # inner items come later and win
                for n in walk(item.node):
                    self._by_node[id(n)] = item
        return self._by_node.get(id(node))

    def slice_to(self, item: Item, names: frozenset[str]) -> tuple[Item, ...]:
        """``backward(self.items, item, names)``, kept: the census asks the same
        slices again (each footprint that reads an attribute slices its
        setters), and a function is not changed once flattened."""
        key = (item.index, names)
        found = self._slices.get(key)
        if found is None:
            found = self._slices[key] = tuple(backward(self.items, item, names))
        return found


def _targets(node: cst.CSTNode) -> set[str]:
    """Names bound by an assignment target (tuples and starred included)."""
    if isinstance(node, cst.Name):
        return {node.value}
    if isinstance(node, (cst.Tuple, cst.List)):
        return {n for e in node.elements for n in _targets(e.value)}
    if isinstance(node, cst.StarredElement):
        return _targets(node.value)
    return set()


def _defines(stmt: cst.CSTNode) -> set[str]:
    names: set[str] = set()
    if isinstance(stmt, cst.SimpleStatementLine):
        for small in stmt.body:
            if isinstance(small, cst.Assign):
                for target in small.targets:
                    names |= _targets(target.target)
            elif isinstance(small, (cst.AugAssign, cst.AnnAssign)):
                names |= _targets(small.target)
            elif isinstance(small, (cst.Import, cst.ImportFrom)) and not isinstance(
                small.names, cst.ImportStar
            ):
                for alias in small.names:
                    bound = alias.asname.name if alias.asname else alias.name
                    if isinstance(bound, cst.Name):
                        names.add(bound.value)
    elif isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
        names.add(stmt.name.value)
    return names


class _Flattener:
    def __init__(self, func: cst.FunctionDef) -> None:
        self.flat = FlatFunction(func)
        self.seen_tests: dict[str, int] = {}
        self.code = cst.Module([]).code_for_node

    def add(
        self,
        node: cst.CSTNode,
        conditions: tuple[Branch, ...],
        defines: set[str],
        uses: set[str],
        header: str | None = None,
    ) -> None:
        index = len(self.flat.items)
        self.flat.items.append(Item(index, node, conditions, frozenset(defines), frozenset(uses), header))

    def block(self, suite: cst.BaseSuite, conditions: tuple[Branch, ...]) -> None:
        body = suite.body if isinstance(suite, cst.IndentedBlock) else [suite]
        for stmt in body:
            self.statement(stmt, conditions)

    def if_key(self, test: cst.BaseExpression) -> str:
        text = " ".join(self.code(test).split())
        rank = self.seen_tests.get(text, 0)
        self.seen_tests[text] = rank + 1
        key = f"if {text}" + (f" #{rank + 1}" if rank else "")
        self.flat.if_tests[key] = test
        return key

    def statement(self, stmt: cst.CSTNode, conditions: tuple[Branch, ...]) -> None:
        # by type, not isinstance (LibCST's abstract base class makes each miss a call)
        if type(stmt) is cst.If:
            key = self.if_key(stmt.test)
            self.add(stmt.test, conditions, set(), free_names(stmt.test), "if")
            self.block(stmt.body, (*conditions, (key, True)))
            if isinstance(stmt.orelse, cst.If):
                self.statement(stmt.orelse, (*conditions, (key, False)))
            elif isinstance(stmt.orelse, cst.Else):
                self.block(stmt.orelse.body, (*conditions, (key, False)))
        elif type(stmt) is cst.For:
            self.add(stmt, conditions, _targets(stmt.target), free_names(stmt.iter), "for")
            self.block(stmt.body, conditions)
            if stmt.orelse is not None:
                self.block(stmt.orelse.body, conditions)
        elif type(stmt) is cst.While:
            self.add(stmt.test, conditions, set(), free_names(stmt.test), "while")
            self.block(stmt.body, conditions)
        elif type(stmt) is cst.With:
            bound = {n for item in stmt.items if item.asname for n in _targets(item.asname.name)}
            uses = {n for item in stmt.items for n in free_names(item.item)}
            self.add(stmt, conditions, bound, uses, "with")
            self.block(stmt.body, conditions)
        elif type(stmt) is cst.Try:
            self.block(stmt.body, conditions)
            for handler in stmt.handlers:
                self.block(handler.body, conditions)
            for extra in (stmt.orelse, stmt.finalbody):
                if extra is not None:
                    self.block(extra.body, conditions)
        else:
            uses = free_names(stmt) if type(stmt) is not cst.ClassDef else set()
            defines = _defines(stmt)
            self.add(stmt, conditions, defines, uses - defines if type(stmt) is cst.FunctionDef else uses)


def flatten(func: cst.FunctionDef) -> FlatFunction:
    flattener = _Flattener(func)
    flattener.block(func.body, ())
    return flattener.flat


def header_code(item: Item, code) -> str:
    """The code an item stands for in a footprint (a compound statement only
    by its header, not its body)."""
    node = item.node
    if item.header == "for" and isinstance(node, cst.For):
        return f"for {code(node.target)} in {code(node.iter)}"
    if item.header == "with" and isinstance(node, cst.With):
        return "with " + ", ".join(code(i) for i in node.items)
    if item.header in ("if", "while"):
        return f"{item.header} {code(node)}"
    return code(node)


def consistent(conditions: tuple[Branch, ...], path: dict[str, bool]) -> bool:
    """Whether an item under ``conditions`` lies on ``path`` (branches the
    path does not fix are open)."""
    return all(path.get(key, taken) == taken for key, taken in conditions)


def on_path(flat: FlatFunction, path: dict[str, bool]) -> list[Item]:
    return [item for item in flat.items if consistent(item.conditions, path)]


def _certain(item: Item, path: dict[str, bool]) -> bool:
    """Whether ``item`` runs on every execution of ``path`` (every ``if``
    around it is fixed by the path)."""
    return all(key in path for key, _ in item.conditions)


def backward(
    items: list[Item], start: Item, names: Set[str], path: dict[str, bool] | None = None
) -> list[Item]:
    """Items along ``items`` (one path, in order) that reach ``names`` used
    at ``start``: for each use, the latest earlier definition, then its own
    uses. A definition under an ``if`` the path leaves open may not run, so
    the search goes on past it to the earlier ones."""
    path = path if path is not None else {}
    found: dict[int, Item] = {}
    pending = [(name, _position(items, start)) for name in names]
    seen: set[tuple[str, int]] = set()
    while pending:
        name, before = pending.pop()
        if (name, before) in seen:
            continue
        seen.add((name, before))
        for i in range(before - 1, -1, -1):
            item = items[i]
            if name in item.defines:
                if item.index not in found:
                    found[item.index] = item
                    pending += [(used, i) for used in item.uses]
                if _certain(item, path):
                    break
    return sorted(found.values(), key=lambda item: item.index)


def _position(items: list[Item], start: Item) -> int:
    """Where ``start`` stands in ``items`` (a function's items, or those of
    one path: each index once), else ``len(items)``."""
    if start.index < len(items) and items[start.index] is start:
        return start.index  # all of the function's items: each stands at its index
    return next((i for i, item in enumerate(items) if item.index == start.index), len(items))


def consumers(items: list[Item], start: Item, path: dict[str, bool] | None = None) -> list[Item]:
    """Items after ``start`` that read a name ``start`` defines before it is
    surely defined again (one hop: the direct consumers of the site's result)."""
    path = path if path is not None else {}
    live = set(start.defines)
    found = []
    position = next((i for i, item in enumerate(items) if item.index == start.index), None)
    if position is None:
        return []
    for item in items[position + 1 :]:
        if not live:
            break
        if item.uses & live:
            found.append(item)
        if _certain(item, path):
            live -= item.defines
    return found


def direct_definitions(items: list[Item], start: Item, names: set[str]) -> list[Item]:
    """The definitions that may reach ``names`` at ``start`` (one hop)."""
    position = next((i for i, item in enumerate(items) if item.index == start.index), len(items))
    found = []
    for name in names:
        for item in reversed(items[:position]):
            if name in item.defines:
                found.append(item)
                if not item.conditions:
                    break
    return found


def relevant_ifs(flat: FlatFunction, start: Item, names: set[str]) -> list[str]:
    """The ``if`` keys whose branches hold a definition that feeds the site
    directly: the branches that choose between ways of computing its inputs. The ``if`` statements enclosing
    the site are fixed by the site itself and are left out."""
    near = direct_definitions(flat.items, start, names)
    fixed = {key for key, _ in start.conditions}
    keys: list[str] = []
    for item in near:
        for key, _ in item.conditions:
            if key not in fixed and key not in keys:
                keys.append(key)
    return keys


def paths(flat: FlatFunction, start: Item, names: set[str], limit: int = 4) -> Iterator[dict[str, bool]]:
    """Every combination of branches of the relevant ``if`` statements (the
    site's own enclosing branches fixed); beyond ``limit`` of them the rest
    are left open."""
    base = dict(start.conditions)
    keys = relevant_ifs(flat, start, names)[:limit]
    for mask in range(2 ** len(keys)):
        path = dict(base)
        for bit, key in enumerate(keys):
            path[key] = bool(mask >> bit & 1)
        yield path


def self_attrs_read(node: cst.CSTNode) -> set[str]:
    return {attr for n in walk(node) if (attr := self_attr(n)) is not None}
