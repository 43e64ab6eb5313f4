"""Import a model package directory the way the serving engine's registry
does, and find its exported ``<Prefix>ForCausalLM`` factory.

The directory (``reference_models/llama3`` or a port's
``vllm_neuron/model/<name>/``) is imported under a private package name, so
its relative imports (``from .config import ...``) work without installing
it; ``imported_package`` removes it from ``sys.modules`` afterwards.
"""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
import re
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from autoport_cst.errors import InputError

_COUNTER = itertools.count()


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
        if name.endswith("ForCausalLM") and hasattr(getattr(module, name, None), "from_configs")
    ]
    if len(candidates) != 1:
        raise PortImportError(
            f"{directory / '__init__.py'}: expected exactly one exported <Prefix>ForCausalLM "
            f"class with from_configs(), found {candidates or 'none'}"
        )
    return candidates[0], getattr(module, candidates[0])


@contextlib.contextmanager
def imported_package(directory: str | Path) -> Iterator[ModelPackage]:
    """Import the package for the duration of the block."""
    path = check_package_dir(directory).resolve()
    slug = re.sub(r"\W", "_", path.name)
    name = f"_autoport_port_{slug}_{next(_COUNTER)}"
    spec = importlib.util.spec_from_file_location(
        name, path / "__init__.py", submodule_search_locations=[str(path)]
    )
    if spec is None or spec.loader is None:  # pragma: no cover - defensive
        raise InputError(f"{path}: cannot be imported as a package")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        try:
            spec.loader.exec_module(module)
        except Exception as error:  # the port's own code failed to import
            raise PortImportError(f"importing {path} failed: {type(error).__name__}: {error}") from error
        factory_name, factory = _find_factory(module, path)
        yield ModelPackage(path, module, factory, factory_name)
    finally:
        for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
            del sys.modules[key]
