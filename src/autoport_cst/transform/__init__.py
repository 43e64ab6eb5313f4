"""The codemod framework (base class, examples, contexts) and the layers
codemods build on: the CST vocabulary (``vocabulary``), the model-anatomy
locators (``anatomy``) and the edit primitives (``cst_helpers`` and the
modules per model part).

The framework names are exported lazily, so that importing a light module
of this package (the lint rules import ``vocabulary``) does not import the
codemod framework and the spec with it.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "Codemod",
    "Example",
    "FileContext",
    "NoParams",
    "Note",
    "PortContext",
    "fail",
    "locate",
    "run_on_source",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from autoport_cst.transform import base

        return getattr(base, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
