"""Locating and indexing transformers modeling source files, read as text.

Nothing here imports transformers: the package directory is found with
``importlib.util.find_spec("transformers")`` (which does not execute the
package) and files are parsed with :mod:`ast`. Relative imports between
modeling files (``from ..llama.modeling_llama import LlamaRMSNorm``) are
followed to the file they name, so inheritance across files resolves.
"""

from __future__ import annotations

import ast
import importlib.util
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from autoport_cst.errors import InputError


@dataclass(eq=False)
class SourceModule:
    """One parsed Python file of the transformers package."""

    dotted: str  # transformers.models.llama.modeling_llama
    path: Path
    tree: ast.Module
    library: SourceLibrary = field(repr=False)

    @cached_property
    def statements(self) -> list[ast.stmt]:
        """The module-level statements, those under a module-level ``if`` or
        ``try`` included, the ``else`` after the ``if`` (xLSTM defines its
        pure-torch classes under ``else:`` of ``if is_xlstm_available():``,
        which runs when the optional package is not installed): a name
        defined in both is the one defined last."""
        out: list[ast.stmt] = []
        pending = list(self.tree.body)
        while pending:
            node = pending.pop(0)
            if isinstance(node, ast.If):
                pending[:0] = [*node.body, *node.orelse]
            elif isinstance(node, ast.Try):
                pending[:0] = [*node.body, *node.orelse, *node.finalbody]
            else:
                out.append(node)
        return out

    @cached_property
    def classes(self) -> dict[str, ast.ClassDef]:
        return {n.name: n for n in self.statements if isinstance(n, ast.ClassDef)}

    @cached_property
    def functions(self) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
        return {n.name: n for n in self.statements if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}

    @cached_property
    def imports(self) -> dict[str, str]:
        """Local name -> absolute dotted name of what it refers to."""
        names: dict[str, str] = {}
        package = self.dotted.rsplit(".", 1)[0]
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    local = alias.asname or alias.name.split(".")[0]
                    names[local] = alias.name if alias.asname else alias.name.split(".")[0]
            elif isinstance(node, ast.ImportFrom):
                base = _absolute(package, node.module, node.level)
                for alias in node.names:
                    names[alias.asname or alias.name] = f"{base}.{alias.name}"
        return names

    @cached_property
    def assignments(self) -> dict[str, ast.expr]:
        """Module-level ``NAME = expr`` assignments."""
        found: dict[str, ast.expr] = {}
        for node in self.statements:
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        found[target.id] = node.value
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value:
                found[node.target.id] = node.value
        return found

    def line_of(self, node: ast.AST) -> str:
        return f"{self.path.name}:{getattr(node, 'lineno', 0)}"


def _absolute(package: str, module: str | None, level: int) -> str:
    if level == 0:
        return module or ""
    parts = package.split(".")
    if level > 1:
        parts = parts[: len(parts) - (level - 1)]
    base = ".".join(parts)
    return f"{base}.{module}" if module else base


class SourceLibrary:
    """Parsed files of one installed transformers package, by dotted name."""

    def __init__(self, root: Path) -> None:
        self.root = root  # the directory of the transformers package
        self._modules: dict[str, SourceModule | None] = {}

    def module(self, dotted: str) -> SourceModule | None:
        if dotted in self._modules:
            return self._modules[dotted]
        found = None
        if dotted == "transformers" or dotted.startswith("transformers."):
            rel = dotted.split(".")[1:]
            candidates = [
                self.root.joinpath(*rel).with_suffix(".py"),
                self.root.joinpath(*rel, "__init__.py"),
            ]
            for path in candidates:
                if path.is_file():
                    found = self._parse(dotted, path)
                    break
        self._modules[dotted] = found
        return found

    def _parse(self, dotted: str, path: Path) -> SourceModule | None:
        try:
            text = path.read_text(encoding="utf-8")
            tree = ast.parse(text, filename=str(path))
        except (OSError, UnicodeDecodeError, SyntaxError):
            return None
        return SourceModule(dotted, path, tree, self)

    def resolve(self, dotted: str) -> tuple[SourceModule, str] | None:
        """``transformers.models.llama.modeling_llama.LlamaRMSNorm`` -> the
        module that defines it and the name, following re-exports."""
        module_name, _, name = dotted.rpartition(".")
        for _ in range(4):
            module = self.module(module_name)
            if module is None:
                return None
            if name in module.classes or name in module.functions:
                return module, name
            target = module.imports.get(name)
            if target is None:
                return None
            module_name, _, name = target.rpartition(".")
        return None


def transformers_root() -> Path | None:
    """The installed transformers package directory, found without importing it."""
    try:
        spec = importlib.util.find_spec("transformers")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def module_directory_name(model_type: str) -> str:
    """transformers' own rule for the package directory of a model_type,
    when transformers is importable; otherwise the same mechanical rule."""
    try:
        from transformers.models.auto.configuration_auto import model_type_to_module_name

        return model_type_to_module_name(model_type)
    except Exception:  # transformers missing or changed: its documented convention
        return model_type.replace("-", "_")


@dataclass(frozen=True)
class ModelingSource:
    library: SourceLibrary
    module: SourceModule
    model_type: str

    @property
    def path(self) -> Path:
        return self.module.path


def locate_modeling_source(model_type: str, config_path: str = "config.json") -> ModelingSource:
    """Find ``transformers/models/<dir>/modeling_<dir>.py`` for a model_type.

    Raises InputError when transformers is not installed or has no modeling
    file for this model_type."""
    root = transformers_root()
    if root is None:
        raise InputError(
            "transformers is not installed: the modeling source cannot be analysed "
            "(pip install 'autoport-cst[validate]')"
        )
    directory = module_directory_name(model_type)
    library = SourceLibrary(root)
    module = None
    # a directory may hold several model types (data2vec: modeling_data2vec_text.py)
    for stem in dict.fromkeys((directory, model_type.replace("-", "_"))):
        module = library.module(f"transformers.models.{directory}.modeling_{stem}")
        if module is not None:
            break
    if module is None:
        module = _mapped_module(model_type, library)
    if module is None:
        raise InputError(
            f"model_type {model_type!r}: no modeling source found in the installed transformers "
            f"(looked for {root / 'models' / directory / f'modeling_{directory}.py'}); "
            "a model whose code is not in transformers (trust_remote_code) cannot be planned",
            _position(config_path),
        )
    return ModelingSource(library, module, model_type)


def _mapped_module(model_type: str, library: SourceLibrary) -> SourceModule | None:
    """The modeling module of the causal-LM class transformers maps a
    model_type without a modeling file of its own to (sarvam_mla:
    DeepseekV3ForCausalLM in modeling_deepseek_v3), or None."""
    try:
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

        name = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type)
        if not isinstance(name, str):
            return None
        import transformers

        dotted = getattr(transformers, name).__module__
    except Exception:  # transformers missing, changed, or the class not importable
        return None
    return library.module(dotted) if dotted.startswith("transformers.models.") else None


def _position(path: str):
    from autoport_cst.errors import Position

    return Position(path, json_path="$.model_type")
