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
        if not self.identity:
            matcher = difflib.SequenceMatcher(
                None, original.splitlines(), current.splitlines(), autojunk=False
            )
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
            # inside written code: the last original line before it
            return MappedLine(original + size, False)
        return MappedLine(1, False)
