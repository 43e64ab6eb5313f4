"""Whole-word renaming inside prose: strings, docstrings, comments, Markdown.

Identifiers are renamed through scope analysis; text has no scopes, so it gets
this separate, conservative pass. A *word* is a maximal run of
``[A-Za-z0-9_]``. It is replaced only when it equals a key of the table
exactly (case-sensitive), and never inside a protected chunk: a
whitespace-delimited chunk that looks like a hub ID, a path or a URL
(contains ``/``, ``://`` or ``@``), or a versioned model name (the word is
followed by ``-`` or a space and a digit, as in ``Llama-3.1-8B`` or ``Llama 3``).
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
            after = text[chunk.start() + word.end() : chunk.start() + word.end() + 2]
            if len(after) == 2 and after[0] in "- " and after[1].isdigit():
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


def prose_token_positions(source: str) -> list[tuple[str, int, int]]:
    """(raw text, 1-based line, 1-based column) of every string and comment
    token of Python ``source``, in source order (f-string text parts on
    Python 3.12+ included). Empty when the source does not tokenize."""
    import io
    import tokenize

    kinds = {tokenize.STRING, tokenize.COMMENT}
    middle = getattr(tokenize, "FSTRING_MIDDLE", None)
    if middle is not None:
        kinds.add(middle)
    found = []
    try:
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if token.type in kinds:
                found.append((token.string, token.start[0], token.start[1] + 1))
    except (tokenize.TokenError, SyntaxError):
        return []
    return found


def locate_prose(tokens: list[tuple[str, int, int]], raw_texts: list[str]) -> list[tuple[int, int] | None]:
    """Positions of string/comment texts, given in source order: each is
    matched to the next token that equals it (or, for f-string parts, that
    contains it)."""
    positions: list[tuple[int, int] | None] = []
    start = 0
    for raw in raw_texts:
        for index in range(start, len(tokens)):
            text, line, col = tokens[index]
            if text == raw:
                positions.append((line, col))
                start = index + 1
                break
            offset = text.find(raw)
            if offset >= 0:
                line_offset, col_offset = line_col(text, offset)
                positions.append((line + line_offset, (col if line_offset == 0 else 1) + col_offset))
                start = index
                break
        else:
            positions.append(None)
    return positions
