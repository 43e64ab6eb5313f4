"""Load frozen dataclasses from JSON-like data, and describe them as JSON Schema.

One set of type hints drives both directions, so the published schema and the
loader cannot disagree. Loading collects *every* problem, each with its JSON
path (``$.spec.norm.kind``), instead of stopping at the first.

Supported annotations: ``bool``, ``int``, ``float``, ``str``, ``Literal[...]``,
``X | None``, ``tuple[T, ...]``, ``list[T]``, ``dict[str, Any]``, ``Any`` and
nested dataclasses. Unknown keys are errors.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from functools import cache
from typing import Any, Literal, Union


@dataclasses.dataclass(frozen=True)
class JsonProblem:
    json_path: str
    message: str

    def __str__(self) -> str:
        return f"{self.json_path}: {self.message}"


@cache
def hints_of(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _describe(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _is_optional(tp: Any) -> tuple[bool, Any]:
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(tp)) == 2:
            return True, args[0]
    return False, tp


def from_json(cls: type, data: Any, path: str = "$") -> tuple[Any, list[JsonProblem]]:
    """Build ``cls`` from ``data``. Returns (instance or None, problems)."""
    problems: list[JsonProblem] = []
    result = _convert(cls, data, path, problems)
    return (None if problems else result), problems


def _convert(tp: Any, data: Any, path: str, problems: list[JsonProblem]) -> Any:
    is_opt, inner = _is_optional(tp)
    if is_opt:
        if data is None:
            return None
        return _convert(inner, data, path, problems)
    if tp is Any:
        return data
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _convert_dataclass(tp, data, path, problems)
    origin = typing.get_origin(tp)
    if origin is Literal:
        allowed = typing.get_args(tp)
        if data not in allowed or isinstance(data, bool) != isinstance(allowed[0], bool):
            choices = ", ".join(repr(a) for a in allowed)
            problems.append(JsonProblem(path, f"expected one of {choices}, got {data!r}"))
        return data
    if origin in (tuple, list):
        if not isinstance(data, list):
            problems.append(JsonProblem(path, f"expected an array, got {_describe(data)}"))
            return None
        item_type = typing.get_args(tp)[0]
        items = [_convert(item_type, item, f"{path}[{i}]", problems) for i, item in enumerate(data)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(data, dict):
            problems.append(JsonProblem(path, f"expected an object, got {_describe(data)}"))
            return None
        return dict(data)
    if tp is bool:
        if not isinstance(data, bool):
            problems.append(JsonProblem(path, f"expected a boolean, got {_describe(data)}"))
        return data
    if tp is int:
        if isinstance(data, bool) or not isinstance(data, int):
            problems.append(JsonProblem(path, f"expected an integer, got {_describe(data)}"))
        return data
    if tp is float:
        if isinstance(data, bool) or not isinstance(data, (int, float)):
            problems.append(JsonProblem(path, f"expected a number, got {_describe(data)}"))
            return data
        return float(data)
    if tp is str:
        if not isinstance(data, str):
            problems.append(JsonProblem(path, f"expected a string, got {_describe(data)}"))
        return data
    raise TypeError(f"typed_json: unsupported annotation {tp!r} at {path}")


def _convert_dataclass(cls: type, data: Any, path: str, problems: list[JsonProblem]) -> Any:
    if not isinstance(data, dict):
        problems.append(JsonProblem(path, f"expected an object, got {_describe(data)}"))
        return None
    hints = hints_of(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    for key in data:
        if key not in fields:
            known = ", ".join(sorted(fields))
            problems.append(JsonProblem(f"{path}.{key}", f"unknown key; known keys: {known}"))
    kwargs = {}
    before = len(problems)
    for name, f in fields.items():
        if name in data:
            kwargs[name] = _convert(hints[name], data[name], f"{path}.{name}", problems)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            problems.append(JsonProblem(f"{path}.{name}", "required key is missing"))
    if len(problems) > before:
        return None
    return cls(**kwargs)


def to_json(obj: Any) -> Any:
    """Plain JSON data for a dataclass instance (tuples become arrays)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_json(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_json(x) for x in obj]
    if isinstance(obj, dict):
        return {k: to_json(v) for k, v in obj.items()}
    return obj


def schema_of(tp: Any, definitions: dict[str, Any]) -> dict[str, Any]:
    """JSON Schema (draft 2020-12) for an annotation; dataclasses go into
    ``definitions`` under their class name."""
    is_opt, inner = _is_optional(tp)
    if is_opt:
        return {"anyOf": [schema_of(inner, definitions), {"type": "null"}]}
    if tp is Any:
        return {}
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        name = tp.__name__
        if name not in definitions:
            definitions[name] = {}  # placeholder against recursion
            hints = hints_of(tp)
            props = {}
            required = []
            for f in dataclasses.fields(tp):
                if not f.init:
                    continue
                prop = schema_of(hints[f.name], definitions)
                doc = f.metadata.get("doc")
                if doc:
                    prop = {**prop, "description": doc}
                if f.default is not dataclasses.MISSING:
                    prop["default"] = to_json(f.default)
                elif f.default_factory is dataclasses.MISSING:
                    required.append(f.name)
                props[f.name] = prop
            body: dict[str, Any] = {
                "type": "object",
                "additionalProperties": False,
                "properties": props,
            }
            if tp.__doc__ and not tp.__doc__.startswith(f"{name}("):
                body["description"] = " ".join(tp.__doc__.split())
            if required:
                body["required"] = required
            definitions[name] = body
        return {"$ref": f"#/$defs/{name}"}
    origin = typing.get_origin(tp)
    if origin is Literal:
        return {"enum": list(typing.get_args(tp))}
    if origin in (tuple, list):
        return {"type": "array", "items": schema_of(typing.get_args(tp)[0], definitions)}
    if origin is dict:
        return {"type": "object"}
    simple = {bool: "boolean", int: "integer", float: "number", str: "string"}
    if tp in simple:
        return {"type": simple[tp]}
    raise TypeError(f"typed_json: unsupported annotation {tp!r}")
