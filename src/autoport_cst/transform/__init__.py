"""The codemod framework (base class, examples, contexts) and shared CST helpers."""

from autoport_cst.transform.base import (
    Codemod,
    Example,
    FileContext,
    NoParams,
    Note,
    PortContext,
    fail,
    locate,
    run_on_source,
)

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
