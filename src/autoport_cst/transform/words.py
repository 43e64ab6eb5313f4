"""Whole-word renaming inside prose: strings, docstrings, comments, Markdown.

Identifiers are renamed through scope analysis; text has no scopes, so it gets
this separate, conservative pass. A *word* is a maximal run of
``[A-Za-z0-9_]``. It is replaced only when it equals a key of the table
exactly (case-sensitive), and never inside a protected chunk: a
whitespace-delimited chunk that looks like a hub ID, a path or a URL
(contains ``/``, ``://`` or ``@``), or a versioned model name (the word is
followed by ``-`` and a digit, as in ``Llama-3.1-8B``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_WORD = re.compile(r"[A-Za-z0-9_]+")
_CHUNK = re.compile(r"\S+")


@dataclass(frozen=True)
class WordEdit:
    offset: int  # character offset of the word in the text
    old: str
    new: str


def rename_words(text: str, table: dict[str, str]) -> tuple[str, list[WordEdit]]:
    """Replace whole words found in ``table``; return the new text and edits
    (offsets refer to the input text)."""
    if not table or not any(key in text for key in table):
        return text, []
    edits: list[WordEdit] = []
    out: list[str] = []
    last = 0
    for chunk in _CHUNK.finditer(text):
        chunk_text = chunk.group()
        if "/" in chunk_text or "@" in chunk_text:
            continue
        for word in _WORD.finditer(chunk_text):
            new = table.get(word.group())
            if new is None:
                continue
            after = chunk_text[word.end(): word.end() + 2]
            if len(after) == 2 and after[0] == "-" and after[1].isdigit():
                continue
            start = chunk.start() + word.start()
            out.append(text[last:start])
            out.append(new)
            last = start + len(word.group())
            edits.append(WordEdit(start, word.group(), new))
    if not edits:
        return text, []
    out.append(text[last:])
    return "".join(out), edits


def line_col(text: str, offset: int) -> tuple[int, int]:
    """0-based line and column of an offset."""
    line = text.count("\n", 0, offset)
    col = offset - (text.rfind("\n", 0, offset) + 1)
    return line, col
