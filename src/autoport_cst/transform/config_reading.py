"""How a package's config dataclass reads the model config (read only;
shared by the config lint rules and the codemods that repair them).

A vllm_neuron config is a ``@dataclass`` whose ``from_configs`` keeps the
keys of the Hugging Face config that are fields, so what a field ends up
holding depends on where transformers writes the value: a field the model
config lacks keeps its default.
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from autoport_cst.transform.vocabulary import dotted, is_none, self_attr, walk


@dataclass(frozen=True)
class ConfigField:
    name: str
    statement: cst.SimpleStatementLine
    annotation: cst.BaseExpression
    default: cst.BaseExpression | None

    @property
    def default_is_none(self) -> bool:
        return is_none(self.default)


def is_dataclass(cls: cst.ClassDef) -> bool:
    for decorator in cls.decorators:
        target = decorator.decorator
        if isinstance(target, cst.Call):
            target = target.func
        if dotted(target) in ("dataclass", "dataclasses.dataclass"):
            return True
    return False


def dataclass_fields(cls: cst.ClassDef) -> dict[str, ConfigField]:
    """The annotated fields of a ``@dataclass`` class body (empty otherwise)."""
    if not is_dataclass(cls) or not isinstance(cls.body, cst.IndentedBlock):
        return {}
    fields: dict[str, ConfigField] = {}
    for stmt in cls.body.body:
        if not isinstance(stmt, cst.SimpleStatementLine) or len(stmt.body) != 1:
            continue
        small = stmt.body[0]
        if isinstance(small, cst.AnnAssign) and isinstance(small.target, cst.Name):
            fields[small.target.value] = ConfigField(
                small.target.value, stmt, small.annotation.annotation, small.value
            )
    return fields


def method_of(cls: cst.ClassDef, name: str) -> cst.FunctionDef | None:
    body = cls.body.body if isinstance(cls.body, cst.IndentedBlock) else []
    return next((s for s in body if isinstance(s, cst.FunctionDef) and s.name.value == name), None)


def derived_when_none(cls: cst.ClassDef) -> list[str]:
    """Fields ``__post_init__`` sets under ``if self.<field> is None:``."""
    post_init = method_of(cls, "__post_init__")
    if post_init is None:
        return []
    found: list[str] = []
    for node in walk(post_init):
        if not isinstance(node, cst.If) or not isinstance(node.test, cst.Comparison):
            continue
        test = node.test
        if len(test.comparisons) != 1 or not isinstance(test.comparisons[0].operator, cst.Is):
            continue
        attr = self_attr(test.left)
        if attr is None or not is_none(test.comparisons[0].comparator) or attr in found:
            continue
        assigned = {
            self_attr(t.target)
            for n in walk(node.body)
            if isinstance(n, cst.Assign)
            for t in n.targets
        }
        if attr in assigned:
            found.append(attr)
    return found


def mentions(node: cst.CSTNode, word: str) -> bool:
    """Whether the code under ``node`` reads ``word`` anywhere: as a name, an
    attribute or a string key."""
    for node in walk(node):
        if isinstance(node, cst.Name) and node.value == word:
            return True
        if isinstance(node, cst.SimpleString) and node.evaluated_value == word:
            return True
    return False
