"""Names under which transformers writes a model config's fields, read from
the installed transformers' source (never imported: lint stays fast).

A transformers config class may answer to a second name for a field through
its ``attribute_map`` (``Qwen3MoeConfig.num_experts`` reads
``num_local_experts``). ``to_dict()`` and ``config.json`` carry only the name
it maps to. A vllm_neuron config dataclass named like the transformers class
(``Qwen3MoeConfig``) that keeps the model config's keys matching its fields
never sees the alias: the field keeps its default. The base config class
has such names too: a property with a setter that reads and writes another
attribute (``torch_dtype``, which transformers 5 writes as ``dtype``).
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import re
from pathlib import Path


def written_as(class_name: str) -> dict[str, str]:
    """``{alias: name written to config.json}`` of the transformers config
    class called ``class_name`` (empty when transformers is not installed or
    has no such class in the model directory its name implies)."""
    path = _config_path(class_name)
    cls = _transformers_class(path, (class_name,)) if path is not None else None
    if cls is None:
        return {}
    return {**_base_aliases(), **_class_attribute_map(cls)}


@functools.cache
def _base_aliases() -> dict[str, str]:
    """``{alias: name}`` of the base config class's properties that read and
    write another attribute (``torch_dtype`` -> ``dtype`` in transformers 5)."""
    models = _models_dir()
    base = (
        _transformers_class(
            models.parent / "configuration_utils.py", ("PreTrainedConfig", "PretrainedConfig")
        )
        if models is not None
        else None
    )
    if base is None:
        return {}
    getters: dict[str, str] = {}
    setters: dict[str, str] = {}
    for node in base.body:
        if isinstance(node, ast.FunctionDef) and node.body:
            target = _property_target(node)
            if target is None or target.startswith("_"):  # private storage: not a written name
                continue
            if _is_setter(node):
                setters[node.name] = target
            elif any(isinstance(d, ast.Name) and d.id == "property" for d in node.decorator_list):
                getters[node.name] = target
    return {name: target for name, target in getters.items() if setters.get(name) == target}


def _property_target(fn: ast.FunctionDef) -> str | None:
    """``Y`` when ``fn``'s last statement is ``return self.Y`` or ``self.Y = value``."""
    last = fn.body[-1]
    node: ast.expr | None = None
    if isinstance(last, ast.Return):
        node = last.value
    elif isinstance(last, ast.Assign):
        node = last.targets[0]
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
        return node.attr
    return None


def _is_setter(fn: ast.FunctionDef) -> bool:
    return any(isinstance(d, ast.Attribute) and d.attr == "setter" for d in fn.decorator_list)


@functools.cache
def _models_dir() -> Path | None:
    try:
        spec = importlib.util.find_spec("transformers")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)), "models")


def _config_path(class_name: str) -> Path | None:
    """``models/<snake>/configuration_<snake>.py`` of the installed
    transformers for ``<Camel>Config`` (``Qwen3MoeConfig`` -> ``qwen3_moe``)."""
    models = _models_dir()
    if models is None or not class_name.endswith("Config") or class_name == "Config":
        return None
    snake = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", class_name[: -len("Config")]).lower()
    return models / snake / f"configuration_{snake}.py"


@functools.cache
def _transformers_class(path: Path, names: tuple[str, ...]) -> ast.ClassDef | None:
    """The first top-level class of the file at ``path`` named one of
    ``names`` (None when the file cannot be read or parsed, or has none)."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return None
    return next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name in names), None)


def _class_attribute_map(cls: ast.ClassDef) -> dict[str, str]:
    for statement in cls.body:
        target = value = None
        if isinstance(statement, ast.Assign) and len(statement.targets) == 1:
            target, value = statement.targets[0], statement.value
        elif isinstance(statement, ast.AnnAssign):
            target, value = statement.target, statement.value
        if isinstance(target, ast.Name) and target.id == "attribute_map" and value is not None:
            try:
                found = ast.literal_eval(value)
            except ValueError:
                return {}
            return {str(k): str(v) for k, v in found.items()} if isinstance(found, dict) else {}
    return {}
