"""Suppression comments: ``# autoport: ignore[CODE, ...] reason``.

A suppression silences the named codes for a finding when it is

- a trailing comment on the finding's line or on the first line of the
  statement that contains the finding, or
- in the block of comment-only lines directly above that statement.

Codes may be given as codes (``NRN002``) or rule names
(``no-device-move-in-forward``). A blanket ``# autoport: ignore`` (no codes,
``[]`` or ``[*]``) is refused: it silences nothing and is reported as
NRN900, as are unknown codes and a missing reason. A suppression of an enabled
rule that silenced nothing is reported as NRN901.

Comments are found with ``tokenize`` (so text inside strings never counts),
and only in files whose text contains ``autoport:`` at all.
"""

from __future__ import annotations

import io
import re
import tokenize
from dataclasses import dataclass, field

MARKER = "autoport:"
DIRECTIVE = re.compile(r"#\s*autoport\s*:\s*ignore\b(?P<rest>.*)$")
CODES = re.compile(r"\[(?P<codes>[^\]]*)\](?P<reason>.*)$")


@dataclass
class Suppression:
    line: int
    column: int  # 0-based column of the '#'
    end_column: int
    standalone: bool  # the comment is alone on its line
    codes: list[str]  # as written (normalised to codes when known)
    reason: str
    problems: list[str] = field(default_factory=list)
    blanket: bool = False
    used: set[str] = field(default_factory=set)


def find(source: str, known: dict[str, str]) -> list[Suppression]:
    """Suppression comments of ``source``. ``known`` maps every accepted code
    and rule name to its code."""
    if MARKER not in source:
        return []
    comments: list[tuple[int, int, str, str]] = []
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.COMMENT and MARKER in tok.string:
                comments.append((tok.start[0], tok.start[1], tok.string, tok.line))
    except (tokenize.TokenError, SyntaxError, IndentationError):
        # LibCST accepted the file; fall back to a per-line scan
        comments = []
        for number, text in enumerate(source.splitlines(), 1):
            index = text.find("#")
            if index >= 0 and MARKER in text[index:]:
                comments.append((number, index, text[index:], text))
    out = []
    for line, column, text, line_text in comments:
        directive = DIRECTIVE.match(text)
        if directive is None:
            continue
        standalone = line_text[:column].strip() == ""
        rest = directive.group("rest").strip()
        sup = Suppression(
            line=line,
            column=column,
            end_column=column + len(text.rstrip()),
            standalone=standalone,
            codes=[],
            reason="",
        )
        match = CODES.match(rest)
        if match is None:
            sup.blanket = True
            sup.problems.append(
                "blanket suppression `# autoport: ignore` silences nothing: name the codes, "
                "as in `# autoport: ignore[NRN002] reason`"
            )
            out.append(sup)
            continue
        raw = [c.strip() for c in match.group("codes").split(",") if c.strip()]
        sup.reason = match.group("reason").strip()
        if not raw or any(c in ("*", "ALL", "all") for c in raw):
            sup.blanket = True
            sup.problems.append(
                "blanket suppression silences nothing: name the codes, "
                "as in `# autoport: ignore[NRN002] reason`"
            )
            out.append(sup)
            continue
        for code in raw:
            normal = known.get(code) or known.get(code.upper())
            if normal is None:
                sup.problems.append(f"unknown code {code!r} in suppression")
            elif normal not in sup.codes:
                sup.codes.append(normal)
        if not sup.reason:
            sup.problems.append(
                "suppression without a reason: say why, as in "
                "`# autoport: ignore[NRN002] moved on purpose, runs once per step`"
            )
        out.append(sup)
    return out


class Index:
    """Suppressions by line, and the lookup for one finding."""

    def __init__(self, suppressions: list[Suppression], lines: list[str]) -> None:
        self.by_line: dict[int, list[Suppression]] = {}
        for sup in suppressions:
            if not sup.blanket:
                self.by_line.setdefault(sup.line, []).append(sup)
        self.lines = lines

    def _comment_block_above(self, line: int) -> list[int]:
        out = []
        current = line - 1
        while current >= 1:
            text = self.lines[current - 1].strip() if current - 1 < len(self.lines) else ""
            if not text.startswith("#"):
                break
            out.append(current)
            current -= 1
        return out

    def match(self, code: str, line: int, statement_line: int) -> Suppression | None:
        if not self.by_line:
            return None
        candidates = [line, statement_line]
        candidates += self._comment_block_above(statement_line)
        if line != statement_line:
            candidates += self._comment_block_above(line)
        for number in candidates:
            for sup in self.by_line.get(number, ()):
                if code in sup.codes:
                    sup.used.add(code)
                    return sup
        return None
