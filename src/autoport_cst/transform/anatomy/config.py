"""The config dataclass of a package (``<Prefix>Config``), its fields, and how
it reads the model config (read only; shared by the config lint rules and
the codemods that repair them).

A vllm_neuron config is a ``@dataclass`` whose ``from_configs`` keeps the
keys of the Hugging Face config that are fields, so what a field ends up
holding depends on where transformers writes the value: a field the model
config lacks keeps its default.
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from autoport_cst.transform.anatomy.transformers_config import written_as
from autoport_cst.transform.base import FileContext
from autoport_cst.transform.cst.vocabulary import (
    classes_with_role,
    dotted,
    is_none,
    self_attr,
    statements,
    walk,
)


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
            self_attr(t.target) for n in walk(node.body) if isinstance(n, cst.Assign) for t in n.targets
        }
        if attr in assigned:
            found.append(attr)
    return found


def mentions(node: cst.CSTNode, word: str, *, torch_attribute: bool = True) -> bool:
    """Whether the code under ``node`` reads ``word`` anywhere: as a name, an
    attribute or a string key. ``torch_attribute=False``: ``torch.<word>``
    (a type such as ``torch.dtype``) is no read of it."""
    skipped = (
        set()
        if torch_attribute
        else {id(f.attr) for f in walk(node) if isinstance(f, cst.Attribute) and dotted(f.value) == "torch"}
    )
    for found in walk(node):
        if isinstance(found, cst.Name) and found.value == word and id(found) not in skipped:
            return True
        if isinstance(found, cst.SimpleString) and found.evaluated_value == word:
            return True
    return False


def aliased_fields(cls: cst.ClassDef, module: cst.Module) -> list[tuple[ConfigField, str]]:
    """Fields of a config dataclass named as the transformers config class of
    the same name only aliases them (``attribute_map``), each with the name
    transformers writes, unless ``module`` reads that name somewhere."""
    fields = dataclass_fields(cls)
    if not fields:
        return []
    return [
        (fields[alias], written)
        for alias, written in sorted(written_as(cls.name.value).items())
        if alias in fields and written not in fields and not mentions(module, written, torch_attribute=False)
    ]


# Fields transformers derives when a model config does not set them, and how.
KNOWN_DERIVATIONS: dict[str, str] = {
    "head_dim": "self.hidden_size // self.num_attention_heads",
    "num_key_value_heads": "self.num_attention_heads",
}


def fixed_defaults(cls: cst.ClassDef) -> list[ConfigField]:
    """Fields of a config dataclass that a model config may leave unset and
    that should then be derived, but that default to a fixed value instead:
    those ``__post_init__`` derives when None, and those transformers derives
    (``KNOWN_DERIVATIONS``) when the fields they derive from are there too."""
    fields = dataclass_fields(cls)
    names = list(derived_when_none(cls))
    for name, derivation in KNOWN_DERIVATIONS.items():
        sources = {n for n in ("hidden_size", "num_attention_heads") if f"self.{n}" in derivation}
        if name in fields and sources <= set(fields) and name not in names:
            names.append(name)
    return [
        fields[n]
        for n in names
        if n in fields and fields[n].default is not None and not fields[n].default_is_none
    ]


def config_class(module: cst.Module, ctx: FileContext) -> cst.ClassDef:
    """The config dataclass the engine builds (``<Prefix>Config``); of several
    (a vision-language package's text, vision and outer configs), the one
    with ``from_configs``."""
    configs = classes_with_role(module, "config")
    if len(configs) > 1:
        configs = [c for c in configs if method_of(c, "from_configs") is not None]
    if len(configs) != 1:
        raise ctx.refuse(
            "expected one config dataclass (<Prefix>Config, the one with from_configs when there are "
            f"several) in the config file, found {len(configs)}"
        )
    return configs[0]


def field_name(stmt: cst.CSTNode) -> str | None:
    if (
        isinstance(stmt, cst.SimpleStatementLine)
        and len(stmt.body) == 1
        and isinstance(stmt.body[0], cst.AnnAssign)
        and isinstance(stmt.body[0].target, cst.Name)
    ):
        return stmt.body[0].target.value
    return None


def config_fields(cls: cst.ClassDef) -> dict[str, cst.SimpleStatementLine]:
    """name -> statement of each ``name: annotation [= default]`` field."""
    return {
        name: s
        for s in statements(cls)
        if isinstance(s, cst.SimpleStatementLine) and (name := field_name(s)) is not None
    }
