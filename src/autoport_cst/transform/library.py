"""Discovery of the codemod library: every ``Codemod`` subclass defined in a
module of ``autoport_cst.codemods``. Adding a codemod means adding one file;
there is no list to edit.

A codemod's module is named after its ID (``add-qkv-bias`` in
``add_qkv_bias.py``), and spells each field path its ``REALIZES`` declares as
a string literal (``"attention.qkv_bias"``), so a port imports only the
codemods it runs: ``get_codemod`` imports one module, and ``realizing`` reads
the modules' text for a field's path and imports only those that spell it so
(not those that name it in a longer string: ``"attention.qkv_bias, ..."``). ``library`` imports them all (and checks
both conventions).
"""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache
from pathlib import Path
from types import ModuleType

from autoport_cst.errors import InputError, did_you_mean
from autoport_cst.transform.base import Codemod


def _package() -> ModuleType:
    import autoport_cst.codemods as package

    return package


@cache
def _modules() -> dict[str, str]:
    """ID -> module name (``add-qkv-bias`` -> ``add_qkv_bias``), sorted by ID."""
    names = [i.name for i in pkgutil.iter_modules(_package().__path__) if not i.name.startswith("_")]
    return {name.replace("_", "-"): name for name in sorted(names, key=lambda n: n.replace("_", "-"))}


def codemod_ids() -> list[str]:
    """Every codemod's ID, sorted (nothing imported)."""
    return list(_modules())


@cache
def _load(codemod_id: str) -> type[Codemod]:
    """The codemod of ``codemod_id``'s module: the one it defines, by that ID."""
    package = _package()
    module = importlib.import_module(f"{package.__name__}.{_modules()[codemod_id]}")
    found = [
        obj
        for obj in vars(module).values()
        if isinstance(obj, type)
        and issubclass(obj, Codemod)
        and obj is not Codemod
        and obj.__module__ == module.__name__
        and obj.ID
    ]
    if [cls.ID for cls in found] != [codemod_id]:
        ids = ", ".join(cls.ID for cls in found) or "none"
        raise RuntimeError(f"{module.__name__} must define one codemod, of ID {codemod_id!r} (found: {ids})")
    return found[0]


@cache
def library() -> dict[str, type[Codemod]]:
    """ID -> codemod class, sorted by ID (every codemod imported)."""
    codemods = {codemod_id: _load(codemod_id) for codemod_id in _modules()}
    for codemod_id, cls in codemods.items():
        text = _source(codemod_id)
        unspelled = [path for path in cls.REALIZES if text is not None and not _spells(text, path)]
        if unspelled:
            raise RuntimeError(
                f"{cls.__module__} does not spell the REALIZES path(s) {unspelled} as string literals"
            )
    return codemods


def get_codemod(codemod_id: str) -> type[Codemod]:
    if codemod_id not in _modules():
        known = ", ".join(_modules())
        hint = did_you_mean(codemod_id, _modules())
        raise InputError(f"unknown codemod {codemod_id!r}{hint}; known codemods: {known}")
    return _load(codemod_id)


def realizing(path: str) -> list[type[Codemod]]:
    """The codemods whose ``REALIZES`` names the spec field ``path``, by ID
    (imported: those whose module's text spells ``path`` as a string literal,
    or has no text)."""
    found = []
    for codemod_id in _modules():
        text = _source(codemod_id)
        if text is None or _spells(text, path):
            cls = _load(codemod_id)
            if path in cls.REALIZES:
                found.append(cls)
    return found


def _spells(text: str, path: str) -> bool:
    """Whether a module's ``text`` holds ``path`` as a whole string literal."""
    return f'"{path}"' in text or f"'{path}'" in text


@cache
def _source(codemod_id: str) -> str | None:
    """The text of a codemod's module (None when it ships without source)."""
    for directory in _package().__path__:
        file = Path(directory) / f"{_modules()[codemod_id]}.py"
        if file.is_file():
            return file.read_text(encoding="utf-8")
    return None
