"""The graph of a computed value: the operands of nodes, of containers and of
symbolic slices, walked once each."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from autoport_cst.research.interp.values import Node, SliceSym


def children_of(value: Any) -> Iterable[Any]:
    if isinstance(value, Node):
        yield from value.args
        for _, v in value.kwargs:
            yield v
    elif isinstance(value, (tuple, list)):
        yield from value
    elif isinstance(value, dict):
        yield from value.values()
    elif isinstance(value, SliceSym):
        yield from (value.lower, value.upper, value.step)


def walk(value: Any) -> Iterator[Node]:
    """Every Node reachable from ``value`` (each once)."""
    seen: set[int] = set()
    stack = [value]
    while stack:
        current = stack.pop()
        if isinstance(current, Node):
            if id(current) in seen:
                continue
            seen.add(id(current))
            yield current
        if isinstance(current, (Node, tuple, list, dict, SliceSym)):
            stack.extend(children_of(current))


def depends_on(value: Any, target: Node) -> bool:
    return any(node is target for node in walk(value))
