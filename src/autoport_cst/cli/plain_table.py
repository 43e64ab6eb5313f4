"""Tables as plain text, for output that goes to a file or a pipe.

A terminal gets rich's tables; a pipe gets these aligned columns, which read
the same in a CI log and cost no import of rich (about a tenth of a second of
a short command such as ``apply``).
"""

from __future__ import annotations

from collections.abc import Sequence


def plain_table(
    title: str, headers: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[int] = ()
) -> str:
    """``title``, then ``headers`` and ``rows`` in columns two spaces apart;
    the columns numbered in ``right`` are right-aligned."""
    widths = [max(len(row[i]) for row in [headers, *rows]) for i in range(len(headers))]

    def line(cells: Sequence[str]) -> str:
        padded = [
            cell.rjust(width) if i in right else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(cells, widths, strict=True))
        ]
        return "  ".join(padded).rstrip()

    rule = "  ".join("-" * width for width in widths)
    return "\n".join([title, line(headers), rule, *(line(row) for row in rows)]) + "\n"
