"""Import a model package directory the way the serving engine's registry
does, and find its exported ``<Prefix>ForCausalLM`` factory.

The directory (``reference_models/llama3``, a port's
``vllm_neuron/model/<name>/`` or a real vllm_neuron model package) is
imported under its real package name, ``vllm_neuron.model.<directory
name>``, when ``vllm_neuron.model`` is importable (the stand-in installs it):
both its relative imports (``from .config import ...``) and absolute imports
of its own modules (``from vllm_neuron.model.gpt_oss.weight_loaders_bf16
import ...``) then work without installing it. Otherwise it gets a private
name (relative imports only). ``imported_package`` restores ``sys.modules``
afterwards: the package and its submodules are removed, and any module they
shadowed is put back.
"""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
import re
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autoport_cst.errors import InputError

_COUNTER = itertools.count()
# the exported factory: a causal LM, or a vision-language model (reference_models/qwen3_vl)
FACTORY_SUFFIXES = ("ForCausalLM", "ForConditionalGeneration")


class PortImportError(Exception):
    """The package exists but does not import or exports no factory."""


@dataclass
class ModelPackage:
    directory: Path
    module: types.ModuleType
    factory: Any
    factory_name: str


def check_package_dir(directory: str | Path) -> Path:
    path = Path(directory)
    if not path.is_dir():
        raise InputError(f"{path}: no such model package directory")
    if not (path / "__init__.py").is_file():
        raise InputError(f"{path}: not a Python package (no __init__.py)")
    return path


def _find_factory(module: types.ModuleType, directory: Path) -> tuple[str, Any]:
    exported = getattr(module, "__all__", None) or [n for n in vars(module) if not n.startswith("_")]
    candidates = [
        name
        for name in exported
        if name.endswith(FACTORY_SUFFIXES) and hasattr(getattr(module, name, None), "from_configs")
    ]
    if len(candidates) != 1:
        raise PortImportError(
            f"{directory / '__init__.py'}: expected exactly one exported <Prefix>ForCausalLM "
            f"(or <Prefix>ForConditionalGeneration) class with from_configs(), found {candidates or 'none'}"
        )
    return candidates[0], getattr(module, candidates[0])


MODEL_PARENT = "vllm_neuron.model"


def package_name(path: Path) -> str:
    """``vllm_neuron.model.<name>`` when that parent package is importable,
    a private name otherwise."""
    slug = re.sub(r"\W", "_", path.name)
    if slug[:1].isdigit():
        slug = "_" + slug
    if MODEL_PARENT in sys.modules:
        return f"{MODEL_PARENT}.{slug}"
    return f"_autoport_port_{slug}_{next(_COUNTER)}"


def _modules_under(name: str) -> dict[str, types.ModuleType]:
    return {key: module for key, module in sys.modules.items() if key == name or key.startswith(name + ".")}


@contextlib.contextmanager
def imported_package(directory: str | Path) -> Iterator[ModelPackage]:
    """Import the package for the duration of the block."""
    path = check_package_dir(directory).resolve()
    name = package_name(path)
    spec = importlib.util.spec_from_file_location(
        name, path / "__init__.py", submodule_search_locations=[str(path)]
    )
    if spec is None or spec.loader is None:  # pragma: no cover - defensive
        raise InputError(f"{path}: cannot be imported as a package")
    shadowed = _modules_under(name)
    parent, _, child = name.rpartition(".")
    parent_module = sys.modules.get(parent)
    previous_attribute = getattr(parent_module, child, None) if parent_module else None
    for key in shadowed:
        del sys.modules[key]
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    if parent_module is not None:
        setattr(parent_module, child, module)
    try:
        try:
            spec.loader.exec_module(module)
        except Exception as error:  # the port's own code failed to import
            raise PortImportError(f"importing {path} failed: {type(error).__name__}: {error}") from error
        factory_name, factory = _find_factory(module, path)
        yield ModelPackage(path, module, factory, factory_name)
    finally:
        for key in _modules_under(name):
            del sys.modules[key]
        sys.modules.update(shadowed)
        if parent_module is not None:
            if previous_attribute is None:
                parent_module.__dict__.pop(child, None)
            else:
                setattr(parent_module, child, previous_attribute)
