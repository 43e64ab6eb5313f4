"""Positions in a file as the user has it.

Codemods run one after another, each on the text the previous one left, so a
node's line is a line of that intermediate text. ``PositionMap`` maps it back
to the reference file the user gave: lines that earlier steps left alone map
exactly; a line inside code an earlier step wrote maps to the reference line
that code replaced or follows, and is marked as such.
"""

from __future__ import annotations

import bisect
import difflib
from dataclasses import dataclass


@dataclass(frozen=True)
class MappedLine:
    line: int  # 1-based line in the original text
    exact: bool  # False: the line was written by an earlier step


class PositionMap:
    def __init__(self, original: str, current: str) -> None:
        self.identity = original == current
        self._starts: list[int] = []
        self._blocks: list[tuple[int, int, int]] = []  # (current start, original start, length), 0-based
        self._original: list[str] = []
        self._current: list[str] = []
        if not self.identity:
            self._original, self._current = original.splitlines(), current.splitlines()
            matcher = difflib.SequenceMatcher(None, self._original, self._current, autojunk=False)
            for block in matcher.get_matching_blocks():
                if block.size:
                    self._blocks.append((block.b, block.a, block.size))
            self._starts = [b[0] for b in self._blocks]

    def original_line(self, line: int) -> MappedLine:
        """The original line of 1-based ``line`` of the current text."""
        if self.identity:
            return MappedLine(line, True)
        index = line - 1
        at = bisect.bisect_right(self._starts, index) - 1
        if at >= 0:
            current, original, size = self._blocks[at]
            if index < current + size:
                return MappedLine(original + (index - current) + 1, True)
            # inside written code: the line it rewrote, else the last original line before it
            return MappedLine(self._rewritten(index, at) or original + size, False)
        return MappedLine(self._rewritten(index, at) or 1, False)

    def _rewritten(self, index: int, at: int) -> int | None:
        """The 1-based original line that line ``index`` (0-based, inside
        written code after block ``at``) rewrote: the one line of the replaced
        original lines with the same text but for its indentation (an earlier
        step that wrapped code in a block re-indents it), or None."""
        start = self._blocks[at][1] + self._blocks[at][2] if at >= 0 else 0
        end = self._blocks[at + 1][1] if at + 1 < len(self._blocks) else len(self._original)
        text = self._current[index].strip()
        if not text:
            return None
        found = [i for i in range(start, end) if self._original[i].strip() == text]
        return found[0] + 1 if len(found) == 1 else None
