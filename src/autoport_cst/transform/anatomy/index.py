"""What the locators read of a module, computed once per module.

Every site of every family is sliced against the same few facts: the
flattened methods, what each class assigns to ``self`` (and where it
attaches weight loaders), which methods call which, and the generated code
of nodes. ``ModuleIndex`` computes each on first use and keeps it, so a
census of a large file walks each method a bounded number of times.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from autoport_cst.transform.anatomy import flow
from autoport_cst.transform.anatomy.families import Owner
from autoport_cst.transform.cst.roles import class_role
from autoport_cst.transform.cst.statement_code import node_code
from autoport_cst.transform.cst.vocabulary import IS_CALL, call_name, self_assignment, self_attr, walk


def methods(cls: cst.ClassDef) -> list[cst.FunctionDef]:
    body = cls.body.body if isinstance(cls.body, cst.IndentedBlock) else []
    return [s for s in body if isinstance(s, cst.FunctionDef)]


def own_nodes(item: flow.Item) -> list[cst.CSTNode]:
    """The nodes an item stands for (a compound statement only by its header)."""
    node = item.node
    if item.header == "for" and isinstance(node, cst.For):
        return [node.target, node.iter]
    if item.header == "with" and isinstance(node, cst.With):
        return list(node.items)
    return [node]


def loaded_attr(stmt: cst.CSTNode) -> str | None:
    """``x`` for ``set_weight_loader(self.x, ...)`` (or ``self.x.weight``)."""
    if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
        return None
    small = stmt.body[0]
    if not isinstance(small, cst.Expr) or not isinstance(small.value, cst.Call):
        return None
    call = small.value
    if (call_name(call) or "").rsplit(".", 1)[-1] != "set_weight_loader" or not call.args:
        return None
    target = call.args[0].value
    attr = self_attr(target)
    if attr is None and isinstance(target, cst.Attribute):
        attr = self_attr(target.value)
    return attr


@dataclass
class Reads:
    """What a subtree reads: ``self`` attributes and calls."""

    attrs: set[str] = field(default_factory=set)
    calls: list[cst.Call] = field(default_factory=list)


@dataclass
class ClassFacts:
    """Per class: where each ``self`` attribute is set or gets its loader, and
    where each method is called through ``self``."""

    setters: dict[str, list[tuple[flow.FlatFunction, flow.Item]]] = field(default_factory=dict)
    self_calls: dict[str, list[tuple[flow.FlatFunction, flow.Item, cst.Call]]] = field(default_factory=dict)
    methods: dict[str, cst.FunctionDef] = field(default_factory=dict)


# One method's part of its class's facts: where it sets each attribute, and
# where it calls each method through ``self``.
MethodFacts = tuple[
    dict[str, list[tuple[flow.FlatFunction, flow.Item]]],
    dict[str, list[tuple[flow.FlatFunction, flow.Item, cst.Call]]],
]


class NodeMemo:
    """What is computed from a node alone (a method flattened, a class's
    or a method's facts, what a subtree reads, the code of a node in a layout), kept across
    the modules of one port: a step keeps the nodes it does not change, so a
    changed module's unchanged classes and methods are not read again. Holds
    the nodes it has seen, so their ids stay theirs."""

    def __init__(self) -> None:
        self.code: dict[tuple[str, str], dict[int, tuple[cst.CSTNode, str]]] = {}
        self.flat: dict[int, tuple[cst.CSTNode, flow.FlatFunction]] = {}
        self.owners: dict[int, tuple[cst.CSTNode, Owner]] = {}
        self.facts: dict[int, tuple[cst.CSTNode, ClassFacts]] = {}
        self.method_facts: dict[int, tuple[cst.CSTNode, MethodFacts]] = {}
        self.reads: dict[int, tuple[cst.CSTNode, Reads]] = {}
        self.calls: dict[int, tuple[cst.CSTNode, list[cst.Call]]] = {}


class ModuleIndex:
    """Classes, module functions and generated code of one module, cached
    (in ``memo``, shared with other modules, when given)."""

    def __init__(self, module: cst.Module, memo: NodeMemo | None = None) -> None:
        self.module = module
        self.classes = {s.name.value: s for s in module.body if isinstance(s, cst.ClassDef)}
        self.functions = {s.name.value: s for s in module.body if isinstance(s, cst.FunctionDef)}
        memo = memo or NodeMemo()
        self._code = memo.code.setdefault((module.default_indent, module.default_newline), {})
        self._flat = memo.flat
        self._owners = memo.owners
        self._facts = memo.facts
        self._method_facts = memo.method_facts
        self._reads = memo.reads
        self._calls = memo.calls
        # (kind, name) -> what a lookup by name found, while someone records them
        self.lookups: dict[tuple[str, str], cst.CSTNode | None] | None = None

    def class_named(self, name: str) -> cst.ClassDef | None:
        found = self.classes.get(name)
        if self.lookups is not None:
            self.lookups[("class", name)] = found
        return found

    def function_named(self, name: str) -> cst.FunctionDef | None:
        found = self.functions.get(name)
        if self.lookups is not None:
            self.lookups[("function", name)] = found
        return found

    def finds(self, lookups: dict[tuple[str, str], cst.CSTNode | None]) -> bool:
        """Whether each lookup by name finds the same node here."""
        tables: dict[str, dict[str, cst.ClassDef] | dict[str, cst.FunctionDef]] = {
            "class": self.classes,
            "function": self.functions,
        }
        return all(tables[kind].get(name) is found for (kind, name), found in lookups.items())

    def code(self, node: cst.CSTNode) -> str:
        found = self._code.get(id(node))
        if found is None:
            found = self._code[id(node)] = (node, node_code(self.module, node))
        return found[1]

    def flat(self, func: cst.FunctionDef) -> flow.FlatFunction:
        found = self._flat.get(id(func))
        if found is None:
            found = self._flat[id(func)] = (func, flow.flatten(func))
        return found[1]

    def owner(self, cls: cst.ClassDef) -> Owner:
        found = self._owners.get(id(cls))
        if found is None:
            found = self._owners[id(cls)] = (cls, Owner(cls, class_role(cls.name.value)))
        return found[1]

    def reads(self, node: cst.CSTNode) -> Reads:
        """The ``self`` attributes and calls under ``node``."""
        found = self._reads.get(id(node))
        if found is None:
            reads = Reads()
            for n in walk(node):
                attr = self_attr(n)
                if attr is not None:
                    reads.attrs.add(attr)
                if IS_CALL[type(n)]:
                    reads.calls.append(n)  # type: ignore[arg-type]
            found = self._reads[id(node)] = (node, reads)
        return found[1]

    def calls(self, node: cst.CSTNode) -> list[cst.Call]:
        """The calls under ``node``, in ``walk`` order."""
        found = self._calls.get(id(node))
        if found is None:
            found = self._calls[id(node)] = (node, [n for n in walk(node) if IS_CALL[type(n)]])  # type: ignore[misc]
        return found[1]

    def facts(self, cls: cst.ClassDef) -> ClassFacts:
        found = self._facts.get(id(cls))
        if found is None:
            found = self._facts[id(cls)] = (cls, self._class_facts(cls))
        return found[1]

    def _class_facts(self, cls: cst.ClassDef) -> ClassFacts:
        """The facts of each method, joined in the class's order (a class a
        step edits keeps the methods it did not change, and their facts)."""
        facts = ClassFacts()
        for func in methods(cls):
            facts.methods[func.name.value] = func
            setters, self_calls = self._facts_of_method(func)
            for attr, where in setters.items():
                facts.setters.setdefault(attr, []).extend(where)
            for callee, calls in self_calls.items():
                facts.self_calls.setdefault(callee, []).extend(calls)
        return facts

    def _facts_of_method(self, func: cst.FunctionDef) -> MethodFacts:
        found = self._method_facts.get(id(func))
        if found is None:
            setters: dict[str, list[tuple[flow.FlatFunction, flow.Item]]] = {}
            self_calls: dict[str, list[tuple[flow.FlatFunction, flow.Item, cst.Call]]] = {}
            flat = self.flat(func)
            for item in flat.items:
                node = item.node
                if isinstance(node, cst.SimpleStatementLine):
                    pair = self_assignment(node)
                    for attr in {pair[0] if pair else None, loaded_attr(node)} - {None}:
                        if attr is not None:
                            setters.setdefault(attr, []).append((flat, item))
                for part in own_nodes(item):
                    for call in self.reads(part).calls:
                        callee = self_attr(call.func)
                        if callee is not None:
                            self_calls.setdefault(callee, []).append((flat, item, call))
            found = self._method_facts[id(func)] = (func, (setters, self_calls))
        return found[1]
