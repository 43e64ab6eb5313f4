"""Where the port that vLLM serves lives, and which architectures its
registry names, read without importing anything.

A port tree is an ``apply`` output directory: ``OUT/vllm_neuron/model/
registry.py`` and the model packages beside it. The serving plugin finds it
by ``AUTOPORT_PORT_DIR``; without it, by walking up from the running script
(``run.py`` sits at ``OUT/examples/vllm_neuron/models/<name>/run.py``) and
then from the working directory, to the first directory holding a registry.

The registry is read as code (``ast``): ``get_models()`` returns a list of
``("Architecture", Class)`` tuples, and the architecture strings are the
first elements of those tuples. The engine looks a checkpoint up by the
exact string of its ``config.json``; ``match_architecture`` tells a missing
entry from one that differs in case only (the classic mistake whose symptom
on a Trainium instance is an ``AttributeError`` from ``from_configs``).
"""

from __future__ import annotations

import ast
import os
import sys
from pathlib import Path

from autoport_cst.errors import InputError

PORT_DIR_VARIABLE = "AUTOPORT_PORT_DIR"
REGISTRY = Path("vllm_neuron") / "model" / "registry.py"


def registry_path(out_dir: str | Path) -> Path:
    return Path(out_dir) / REGISTRY


def _holding_registry(start: Path) -> Path | None:
    for directory in (start, *start.parents):
        if registry_path(directory).is_file():
            return directory
    return None


def find_port_tree(script: str | None = None, cwd: str | Path | None = None) -> Path:
    """The port tree: ``AUTOPORT_PORT_DIR``, else the nearest directory above
    the script, else above the working directory, that holds a registry."""
    named = os.environ.get(PORT_DIR_VARIABLE)
    if named:
        if not registry_path(named).is_file():
            raise InputError(f"{PORT_DIR_VARIABLE}={named}: no {REGISTRY} there")
        return Path(named).resolve()
    script = script if script is not None else (sys.argv[0] if sys.argv and sys.argv[0] else None)
    starts = [Path(script).resolve().parent] if script else []
    starts.append(Path(cwd or os.getcwd()).resolve())
    for start in starts:
        found = _holding_registry(start)
        if found is not None:
            return found
    raise InputError(
        f"no port tree found: set {PORT_DIR_VARIABLE} to the directory apply wrote "
        f"(the one holding {REGISTRY}), or run from inside it"
    )


def _entry_strings(function: ast.FunctionDef) -> list[str]:
    names = []
    for node in ast.walk(function):
        if isinstance(node, ast.Tuple) and len(node.elts) == 2:
            first = node.elts[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                names.append(first.value)
    return names


def registry_architectures(out_dir: str | Path) -> list[str]:
    """The architecture strings of the registry's ``get_models()``."""
    path = registry_path(out_dir)
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except FileNotFoundError:
        raise InputError(f"{path}: no registry (is {out_dir} a directory apply wrote?)") from None
    except SyntaxError as error:
        raise InputError(f"{path}:{error.lineno}: the registry does not parse: {error.msg}") from None
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "get_models":
            return _entry_strings(node)
    raise InputError(f"{path}: no get_models() function")


def registry_packages(out_dir: str | Path) -> dict[str, str]:
    """Architecture string -> the model package (directory name) whose class
    the registry pairs with it (``from .qwen2 import Qwen2ForCausalLM``)."""
    path = registry_path(out_dir)
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    modules = {}
    for statement in tree.body:
        if isinstance(statement, ast.ImportFrom) and statement.level == 1 and statement.module:
            for alias in statement.names:
                modules[alias.asname or alias.name] = statement.module.split(".")[0]
    packages = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Tuple) and len(node.elts) == 2:
            first, second = node.elts
            if (
                isinstance(first, ast.Constant)
                and isinstance(first.value, str)
                and isinstance(second, ast.Name)
            ):
                if second.id in modules:
                    packages[first.value] = modules[second.id]
    return packages


def match_architecture(architecture: str, registered: list[str], registry: str | Path) -> str:
    """``architecture`` if the registry has it exactly; otherwise an
    ``InputError`` that names the near miss (a difference in case) or lists
    what the registry has."""
    if architecture in registered:
        return architecture
    near = [name for name in registered if name.lower() == architecture.lower()]
    if near:
        raise InputError(
            f"{registry}: the registry has {near[0]!r} but config.json's architectures[0] is "
            f"{architecture!r}: the engine looks a model up by the exact string, case included "
            f"(on Trainium the mismatch surfaces as an AttributeError from from_configs); "
            f"make the registry entry and the plan's architecture {architecture!r}"
        )
    raise InputError(
        f"{registry}: no entry for {architecture!r} (config.json's architectures[0]); "
        f"the registry has {registered or 'none'}"
    )
