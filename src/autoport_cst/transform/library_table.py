"""The codemod library as a Markdown table (README's, printed by
``autoport-cst codemods --output-format markdown``): one row per codemod,
read from its class: its ID, the spec fields it realizes (or what it is for)
and the first paragraph of its docstring."""

from __future__ import annotations

import re
from collections.abc import Mapping

from autoport_cst.transform.base import Codemod

HEADER = "| codemod | realizes | what it does |\n|---|---|---|\n"


def realizes_cell(cls: type[Codemod]) -> str:
    if cls.REALIZES:
        return ", ".join(f"`{path}`" for path in cls.REALIZES)
    return f"({cls.PURPOSE})" if cls.PURPOSE else "-"


def markdown(text: str) -> str:
    """reStructuredText literals (````x````) as Markdown's (```x```), pipes escaped."""
    return re.sub(r"``(.+?)``", r"`\1`", text).replace("|", "\\|")


def markdown_table(codemods: Mapping[str, type[Codemod]]) -> str:
    rows = (
        f"| `{cls.ID}` | {realizes_cell(cls)} | {markdown(cls.summary())} |\n" for cls in codemods.values()
    )
    return HEADER + "".join(rows)
