"""Discovery of the codemod library: every ``Codemod`` subclass defined in a
module of ``autoport_cst.codemods``. Adding a codemod means adding one file;
there is no list to edit."""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache

from autoport_cst.errors import InputError, did_you_mean
from autoport_cst.transform.base import Codemod


@cache
def library() -> dict[str, type[Codemod]]:
    """ID -> codemod class, sorted by ID."""
    import autoport_cst.codemods as package

    found: dict[str, type[Codemod]] = {}
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda i: i.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        for obj in vars(module).values():
            if (
                isinstance(obj, type)
                and issubclass(obj, Codemod)
                and obj is not Codemod
                and obj.__module__ == module.__name__
                and obj.ID
            ):
                if obj.ID in found:
                    raise RuntimeError(f"codemod ID {obj.ID!r} defined twice")
                found[obj.ID] = obj
    return dict(sorted(found.items()))


def get_codemod(codemod_id: str) -> type[Codemod]:
    codemods = library()
    if codemod_id not in codemods:
        known = ", ".join(codemods)
        hint = did_you_mean(codemod_id, codemods)
        raise InputError(f"unknown codemod {codemod_id!r}{hint}; known codemods: {known}")
    return codemods[codemod_id]
