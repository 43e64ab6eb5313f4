"""Rename classes by scope: definitions, package-relative imports and every
reference that resolves to those bindings; never a same-named variable bound
in another scope, and never a same-named class imported from another package.

Resolution has two paths with the same result:

- Fast path: when the module binds a name exactly once (its class definition
  or its relative import) and nowhere else (no parameter, assignment, loop
  target, import, ``def`` or ``class`` of that name in any scope), every
  variable reference of that name can only resolve to that binding.
- Otherwise LibCST's ``ScopeProvider`` resolves each reference.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import libcst as cst
from libcst.metadata import MetadataWrapper, ScopeProvider

from autoport_cst.transform.cst.printed import Placed, code_in_order, leaves_in_code
from autoport_cst.transform.cst.vocabulary import dotted, nodes_of, walk, walk_pruned
from autoport_cst.transform.edit.tree import Edit, rewrite
from autoport_cst.transform.edit.words import WordEdit, rename_words


class _BindingSurvey:
    """One pass: own bindings (classes, relative imports), how often each name
    is bound anywhere, and the variable references of each name."""

    def __init__(self, names: set[str], package: str = "") -> None:
        self.names = names
        self.package = package
        self.definitions: list[cst.Name] = []
        self.own_bindings: dict[str, list[cst.CSTNode]] = {}
        self.counts: dict[str, int] = {}
        self.references: dict[str, list[cst.Name]] = {}
        self.not_variables: set[int] = set()

    def _bind(self, node: cst.CSTNode | None) -> None:
        if isinstance(node, cst.Name) and node.value in self.names:
            self.counts[node.value] = self.counts.get(node.value, 0) + 1
        elif isinstance(node, (cst.Tuple, cst.List)):
            for element in node.elements:
                self._bind(element.value)
        elif isinstance(node, cst.StarredElement):
            self._bind(node.value)

    def survey(self, module: cst.Module) -> None:
        """What visiting every node in ``walk`` order, except below an import
        or a Name (handled as a whole), records; read off the module's nodes by
        kind (``nodes_of``), each kind in ``walk`` order. The lists it fills are
        read as sets of nodes (and ``references`` keeps ``walk`` order)."""
        imports = nodes_of(module, cst.Import, cst.ImportFrom)
        below_imports = {id(node) for found in imports for node in walk(found)[1:]}
        for found in imports:
            self._import(found)  # type: ignore[arg-type]
        for attribute in nodes_of(module, cst.Attribute):
            self.not_variables.add(id(attribute.attr))  # type: ignore[attr-defined]
        for arg in nodes_of(module, cst.Arg):
            if arg.keyword is not None:  # type: ignore[attr-defined]
                self.not_variables.add(id(arg.keyword))  # type: ignore[attr-defined]
        for kinds, handler in _BINDINGS:
            for found in nodes_of(module, *kinds):
                if id(found) not in below_imports:
                    handler(self, found)
        names = self.names
        for name in nodes_of(module, cst.Name):
            if name.value in names and id(name) not in below_imports:  # type: ignore[attr-defined]
                self._name(name)  # type: ignore[arg-type]

    def survey_by_visits(self, module: cst.Module) -> None:
        """``survey`` as a visit of every node in ``walk`` order, except below
        an import or a Name (handled as a whole)."""
        walk_pruned(module, self.visit)

    def visit(self, node: cst.CSTNode) -> bool:
        """Record what ``node`` binds or references; whether to visit its children."""
        handler = _HANDLERS.get(type(node))
        if handler is None:
            handler = _HANDLERS[type(node)] = _handler_of(type(node))
        return handler(self, node)

    def _name(self, node: cst.Name) -> bool:
        if node.value in self.names and id(node) not in self.not_variables:
            self.references.setdefault(node.value, []).append(node)
        return False

    def _attribute(self, node: cst.Attribute) -> bool:
        self.not_variables.add(id(node.attr))
        return True

    def _arg(self, node: cst.Arg) -> bool:
        if node.keyword is not None:
            self.not_variables.add(id(node.keyword))
        return True

    def _class(self, node: cst.ClassDef) -> bool:
        self._bind(node.name)
        if node.name.value in self.names:
            self.definitions.append(node.name)
            self.own_bindings.setdefault(node.name.value, []).append(node)
        return True

    def _global(self, node: cst.Global | cst.Nonlocal) -> bool:
        for item in node.names:
            self._bind(item.name)
        return True

    def _imports(self, node: cst.Import | cst.ImportFrom) -> bool:
        self._import(node)
        return False

    def _import(self, node: cst.Import | cst.ImportFrom) -> None:
        if isinstance(node.names, cst.ImportStar):
            return
        # the package's own modules, by a relative or an absolute name
        relative = isinstance(node, cst.ImportFrom) and (
            bool(node.relative) or own_package_module(dotted(node.module), self.package)
        )
        for alias in node.names:
            if alias.asname is not None:
                self._bind(alias.asname.name)
            name = dotted(alias.name)
            if name not in self.names:
                continue
            if relative and isinstance(alias.name, cst.Name):
                self.definitions.append(alias.name)
            if alias.asname is None:
                self.counts[name] = self.counts.get(name, 0) + 1
                if relative:
                    self.own_bindings.setdefault(name, []).append(node)


def _visit_children(survey: _BindingSurvey, node: cst.CSTNode) -> bool:
    return True


def _binds(field: str) -> Callable[[_BindingSurvey, Any], bool]:
    """The survey's handler of a node that binds the name(s) in its ``field``."""

    def bind(survey: _BindingSurvey, node: cst.CSTNode) -> bool:
        survey._bind(getattr(node, field))
        return True

    return bind


# What the survey does at each kind of node, in the order it asks (the first kind a node is wins).
_BY_KIND: tuple[tuple[type | tuple[type, ...], Callable[[_BindingSurvey, Any], bool]], ...] = (
    (cst.Name, _BindingSurvey._name),
    (cst.Attribute, _BindingSurvey._attribute),
    (cst.Arg, _BindingSurvey._arg),
    (cst.ClassDef, _BindingSurvey._class),
    ((cst.FunctionDef, cst.Param, cst.AsName, cst.MatchAs, cst.MatchStar), _binds("name")),
    (cst.AssignTarget, _binds("target")),
    ((cst.AnnAssign, cst.AugAssign, cst.For, cst.CompFor, cst.NamedExpr), _binds("target")),
    ((cst.Global, cst.Nonlocal), _BindingSurvey._global),
    (cst.MatchMapping, _binds("rest")),
    ((cst.Import, cst.ImportFrom), _BindingSurvey._imports),
)
_HANDLERS: dict[type, Callable[[_BindingSurvey, Any], bool]] = {}
# The kinds of node that bind names, and their handlers (``survey`` reads them by kind).
_BINDINGS = tuple(
    ((kinds if isinstance(kinds, tuple) else (kinds,)), handler)
    for kinds, handler in _BY_KIND
    if kinds not in (cst.Name, cst.Attribute, cst.Arg, (cst.Import, cst.ImportFrom))
)


def _handler_of(node_type: type) -> Callable[[_BindingSurvey, Any], bool]:
    for kinds, handler in _BY_KIND:
        if issubclass(node_type, kinds):
            return handler
    return _visit_children


def rename_targets(module: cst.Module, table: dict[str, str], package: str = "") -> set[int]:
    """ids of the Name nodes of ``module`` to rename (``package``: the
    package's own name, for absolute imports of its modules)."""
    survey = _BindingSurvey(set(table), package)
    survey.survey(module)
    targets = {id(node) for node in survey.definitions}
    complicated: set[str] = set()
    for name, bindings in survey.own_bindings.items():
        if survey.counts.get(name, 0) == len(bindings) == 1:
            targets.update(id(n) for n in survey.references.get(name, []))
        else:
            complicated.add(name)
    if complicated:
        own = {id(b) for name in complicated for b in survey.own_bindings[name]}
        targets |= _scoped_references(module, complicated, own)
    return targets


def _scoped_references(module: cst.Module, names: set[str], bindings: set[int]) -> set[int]:
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    scopes = wrapper.resolve(ScopeProvider)
    found: set[int] = set()
    for scope in {s for s in scopes.values() if s is not None}:
        for assignment in scope.assignments:
            if assignment.name in names and id(getattr(assignment, "node", None)) in bindings:
                for access in assignment.references:
                    if isinstance(access.node, cst.Name):
                        found.add(id(access.node))
    return found


# -- references through modules of the package ----------------------------------------------

MODEL_ROOT = "vllm_neuron.model"


def own_package_module(name: str | None, package: str) -> bool:
    """Whether dotted ``name`` is the package (``vllm_neuron.model.<package>``)
    or one of its modules."""
    if not name or not package:
        return False
    root = f"{MODEL_ROOT}.{package}"
    return name == root or name.startswith(root + ".")


@dataclass
class ModuleReferences:
    """How a file reaches classes of its package through modules:
    ``aliases`` are names bound to a module of the package (``from . import
    model as _bf16``); ``external`` are names bound by any other import."""

    aliases: set[str] = dataclasses.field(default_factory=set)
    external: set[str] = dataclasses.field(default_factory=set)


def module_references(module: cst.Module, package: str) -> ModuleReferences:
    found = ModuleReferences()
    for node in nodes_of(module, cst.ImportFrom, cst.Import):
        if isinstance(node, cst.ImportFrom) and not isinstance(node.names, cst.ImportStar):
            source = dotted(node.module) if node.module is not None else None
            own = bool(node.relative) or own_package_module(source, package)
            for alias in node.names:
                bound = alias.asname.name if alias.asname else alias.name
                if not isinstance(bound, cst.Name):
                    continue
                # ``from . import model`` binds a module; ``from .model import X`` a class
                (
                    found.aliases
                    if own and (node.module is None or source == f"{MODEL_ROOT}.{package}")
                    else found.external
                ).add(bound.value)
        elif isinstance(node, cst.Import):
            for alias in node.names:
                name = dotted(alias.name) or ""
                if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                    bound_name = alias.asname.name.value
                    (found.aliases if own_package_module(name, package) else found.external).add(bound_name)
                else:
                    found.external.add(name.split(".")[0])
    found.external -= found.aliases
    return found


def _root(node: cst.BaseExpression) -> str | None:
    while isinstance(node, cst.Attribute):
        node = node.value
    return node.value if isinstance(node, cst.Name) else None


def attribute_references(
    module: cst.Module,
    table: dict[str, str],
    package: str,
) -> tuple[set[int], list[cst.Attribute]]:
    """``<module of the package>.<Class>`` attribute names to rename (ids),
    and the ``<something>.<Class>`` accesses whose ``something`` is neither a
    module of the package nor another import: they may reach a renamed class
    in a way this rename cannot follow."""
    refs = module_references(module, package)
    targets: set[int] = set()
    unknown: list[cst.Attribute] = []
    for node in nodes_of(module, cst.Attribute):
        if not isinstance(node, cst.Attribute) or node.attr.value not in table:
            continue
        value = dotted(node.value)
        if value in refs.aliases or own_package_module(value, package):
            targets.add(id(node.attr))
        elif _root(node.value) not in refs.external and _root(node.value) != "self":
            unknown.append(node)
    return targets, unknown


def string_references(module: cst.Module, table: dict[str, str], package: str) -> dict[int, str]:
    """Class names spelled as strings where Python resolves them as names:
    ``getattr(<module of the package>, "Class")`` and the ``__all__`` list.
    Maps each string node's id to its renamed literal."""
    aliases = module_references(module, package).aliases
    found: dict[int, str] = {}

    def take(node: cst.CSTNode) -> None:
        if isinstance(node, cst.SimpleString) and isinstance(node.evaluated_value, str):
            new = table.get(node.evaluated_value)
            if new is not None:
                quote = node.value[len(node.prefix) :][0]
                found[id(node)] = f"{node.prefix}{quote}{new}{quote}"

    for node in nodes_of(module, cst.Call, cst.Assign):  # grouped by kind: what they find is a mapping
        if isinstance(node, cst.Call) and dotted(node.func) in ("getattr", "hasattr") and len(node.args) >= 2:
            if dotted(node.args[0].value) in aliases:
                take(node.args[1].value)
        elif (
            isinstance(node, cst.Assign)
            and any(isinstance(t.target, cst.Name) and t.target.value == "__all__" for t in node.targets)
            and isinstance(node.value, (cst.List, cst.Tuple))
        ):
            for element in node.value.elements:
                take(element.value)
    return found


@dataclass
class Renamed:
    """A module after ``rename_in_module``: the new module, each string or
    comment whose words were renamed (its old raw text and the edits, in
    source order), and the old module's code when such a text was found,
    with its string and comment tokens as ``words.prose_token_positions``
    finds them, when they were read off its printing (``prose_tokens``)."""

    module: cst.Module
    text_edits: list[tuple[str, list[WordEdit]]]
    code: str | None = None
    prose_tokens: list[tuple[str, int, int]] | None = None


def rename_in_module(
    module: cst.Module,
    targets: set[int],
    table: dict[str, str],
    words: dict[str, str],
    names_in_strings: dict[int, str],
) -> Renamed:
    """Rename the Name nodes whose ids are in ``targets`` (``table``), the
    strings that spell a class name where Python resolves it as a name
    (``names_in_strings``), and whole ``words`` in every other string (not
    bytes), f-string text and comment. Only the renamed nodes and their
    ancestors are rebuilt."""
    values: dict[int, str] = {}  # the new value of each renamed leaf
    prose: dict[int, tuple[str, list[WordEdit]]] = {}
    leaves: dict[int, cst.CSTNode] = {}  # the nodes of both, by id
    tokens: list[cst.CSTNode] = []  # the strings and comments
    for node in nodes_of(module, cst.Name, cst.SimpleString, cst.FormattedStringText, cst.Comment):
        kind = type(node)  # the kinds a transformer's leave_<Kind> would be called for
        if kind is cst.SimpleString or kind is cst.Comment:
            tokens.append(node)
        if kind is cst.Name:
            if id(node) in targets:
                values[id(node)] = table[node.value]  # type: ignore[attr-defined]
                leaves[id(node)] = node
        elif kind is cst.SimpleString:
            if id(node) in names_in_strings:
                values[id(node)] = names_in_strings[id(node)]
                leaves[id(node)] = node
            elif words and "b" not in node.prefix.lower():  # type: ignore[attr-defined]
                _rename_words(node, words, values, prose, leaves)
        elif kind in (cst.FormattedStringText, cst.Comment) and words:
            _rename_words(node, words, values, prose, leaves)
    renamed = Renamed(rewrite(module, {key: _renamed(value) for key, value in values.items()}), [])
    if prose:
        # the old code is printed for the notes' positions; the new is spliced from it
        renamed.code, order, renamed.prose_tokens = _prose_in_order(
            module, prose, (renamed.module, values), leaves, tokens
        )
        renamed.text_edits = [prose[id(node)] for node in order]
    return renamed


def _prose_in_order(
    module: cst.Module,
    prose: dict[int, tuple],
    renamed: tuple[cst.Module, dict[int, str]],
    leaves: dict[int, cst.CSTNode],
    tokens: list[cst.CSTNode],
) -> tuple[str, list[cst.CSTNode], list[tuple[str, int, int]] | None]:
    """The old code, the prose leaves in its order, and its string and comment
    tokens placed as ``words.prose_token_positions`` places them, read off
    its printing (None when they cannot be, or would not be the same)."""
    if sys.version_info < (3, 12) or not nodes_of(module, cst.FormattedString):
        wanted = {**leaves, **{id(node): node for node in tokens}}
        found = leaves_in_code(module, list(wanted.values()), renamed)
        if found is not None and "\r" not in found[0]:
            code, placed = found
            return code, [p.node for p in placed if id(p.node) in prose], _python_tokens(placed)
    code, order = code_in_order(module, prose, renamed, leaves)
    return code, order, None


def _python_tokens(placed: list[Placed]) -> list[tuple[str, int, int]]:
    """The string and comment tokens Python's tokenizer finds in the code
    (before 3.12: an f-string is one string token, with whatever it holds),
    as ``prose_token_positions`` gives them."""
    found = []
    inside = -1  # the end of the f-string being read
    for p in placed:
        if p.first < inside:
            continue
        if type(p.node) is cst.FormattedString:
            inside = p.stop
        elif type(p.node) not in (cst.SimpleString, cst.Comment):
            continue
        found.append((p.text, p.line, p.column))
    return found


def _rename_words(
    node: cst.CSTNode,
    words: dict[str, str],
    values: dict[int, str],
    prose: dict[int, tuple],
    leaves: dict[int, cst.CSTNode],
) -> None:
    raw = node.value  # type: ignore[attr-defined]
    new, found = rename_words(raw, words)
    if found:
        prose[id(node)] = (raw, found)
        leaves[id(node)] = node
    if new != raw:
        values[id(node)] = new
        leaves[id(node)] = node


def rename_classes_in_module(module: cst.Module, table: dict[str, str]) -> cst.Module:
    """Identifiers only (no strings or comments)."""
    if not table:
        return module
    targets = rename_targets(module, table)
    names = {id(n): n.value for n in walk(module) if isinstance(n, cst.Name) and id(n) in targets}
    return rewrite(module, {key: _renamed(table[old]) for key, old in names.items()})


def _renamed(new: str) -> Edit:
    return lambda updated: updated.with_changes(value=new)
