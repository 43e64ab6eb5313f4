"""Footprints: the code a site's computation depends on, on one path.

A footprint collects the site's slice (``flow.backward`` and one hop of
consumers), the enclosing ``if`` tests of what it collected, and, followed
from that code: the assignments and weight loaders of the ``self``
attributes it reads, the methods of its class and module functions it calls
(whole), the classes of modules it calls through attributes (whole), and
what the class's other methods pass to the parameters of the methods it
read. Two footprints are compared by digest: equal means the step did not
touch anything the site computes with.
"""

from __future__ import annotations

import hashlib

import libcst as cst

from autoport_cst.transform.anatomy import flow
from autoport_cst.transform.anatomy.index import ModuleIndex, own_nodes
from autoport_cst.transform.cst.vocabulary import dotted, free_names, self_attr


class Footprint:
    def __init__(self, index: ModuleIndex, cls: cst.ClassDef | None) -> None:
        self.index = index
        self.cls = cls
        self.parts: set[str] = set()
        self.seen: set[int] = set()
        self.done: set[tuple[str, str]] = set()

    def add_items(self, flat: flow.FlatFunction, items: list[flow.Item]) -> None:
        for item in items:
            if id(item) in self.seen:
                continue
            self.seen.add(id(item))
            self.parts.add(flow.header_code(item, self.index.code))
            for key, _ in item.conditions:
                self.parts.add(f"if {self.index.code(flat.if_tests[key])}")
            for node in own_nodes(item):
                self.follow(node)
        used = {name for item in items for name in item.uses}
        self.callers(flat.func, used)

    def follow(self, node: cst.CSTNode) -> None:
        reads = self.index.reads(node)
        for attr in reads.attrs:
            self.attribute(attr)
        for call in reads.calls:
            self.callee(call)

    def attribute(self, attr: str) -> None:
        """Where ``self.<attr>`` gets its value: its assignments, and the weight
        loader attached to it (a parameter's value is what its loader makes of
        the checkpoint)."""
        if self.cls is None or ("attr", attr) in self.done:
            return
        self.done.add(("attr", attr))
        for flat, item in self.index.facts(self.cls).setters.get(attr, ()):
            self.add_items(flat, [item, *flat.slice_to(item, item.uses - {"self"})])

    def callers(self, func: cst.FunctionDef, used: set[str]) -> None:
        """For the parameters of ``func`` the slice reads: what the other
        methods of the class pass to them, with the slice of those arguments
        in the caller."""
        if self.cls is None:
            return
        params = [p.name.value for p in func.params.params]
        wanted = [i for i, name in enumerate(params) if name in used and name != "self"]
        if not wanted or ("callers", func.name.value) in self.done:
            return
        self.done.add(("callers", func.name.value))
        for flat, item, call in self.index.facts(self.cls).self_calls.get(func.name.value, ()):
            if flat.func is func:
                continue
            names = frozenset(argument_names(call, params, wanted))
            self.add_items(flat, [item, *flat.slice_to(item, names)])

    def callee(self, call: cst.Call) -> None:
        attr = self_attr(call.func)
        if attr is not None and self.cls is not None:
            own = self.index.facts(self.cls).methods.get(attr)
            if own is not None:
                self.include(own, follow=True)
                return
            # a module held in an attribute: its class, as a whole
            built = self.index.owner(self.cls).attr_classes.get(attr)
            held = self.index.class_named(built or "")
            if held is not None:
                self.include(held, follow=False)
        elif (name := dotted(call.func)) is not None and (function := self.index.function_named(name)):
            self.include(function, follow=True)

    def include(self, target: cst.FunctionDef | cst.ClassDef, follow: bool) -> None:
        if id(target) in self.seen:
            return
        self.seen.add(id(target))
        self.parts.add(self.index.code(target))
        if follow:
            self.follow(target)

    def digest(self) -> str:
        text = "\n\0".join(sorted(self.parts))
        return hashlib.sha1(text.encode()).hexdigest()


def argument_names(call: cst.Call, params: list[str], wanted: list[int]) -> set[str]:
    """Names read by the arguments of a ``self.method(...)`` call that bind
    the parameters at ``wanted`` (indices into ``params``, ``self`` first)."""
    names: set[str] = set()
    positional = [a for a in call.args if a.keyword is None and not a.star]
    for index in wanted:
        name = params[index]
        arg = next((a for a in call.args if a.keyword is not None and a.keyword.value == name), None)
        if arg is None and 0 < index <= len(positional):
            arg = positional[index - 1]
        if arg is not None:
            names |= free_names(arg.value)
    for arg in call.args:
        if arg.star:
            names |= free_names(arg.value)
    return names - {"self"}
