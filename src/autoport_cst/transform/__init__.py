"""The codemod framework (base class, examples, contexts) and the three layers
codemods build on, each importing only those below it: the CST vocabulary
(``cst``: reading nodes, roles, snippets, printing), the model-anatomy
locators (``anatomy``: every site of a family, with its position, or a
positioned refusal; the census) and the edit primitives (``edit``).

The framework names are exported lazily, so that importing a light module
of this package (the lint rules import ``cst.vocabulary``) does not import
the codemod framework and the spec with it.
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
