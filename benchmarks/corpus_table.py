"""The corpus table of ``corpus.py``: rows to markdown, the README's table
back to rows, and the merge of re-measured rows into it.

A row is a dict (``corpus_runs.new_row``): model_type, architecture,
reference, steps, verdict, detail, max_error, seconds, blocked. A row read
back from markdown keeps its cells as text (``cells``) and is written again
as it was; its verdict and blocked features are read from its verdict cell,
so the totals of a merged table count every row.
"""

from __future__ import annotations

import collections
import re
from pathlib import Path

README_START = "<!-- corpus table: written by benchmarks/corpus.py --readme -->"
README_END = "<!-- end of corpus table -->"
HEADER = (
    "| architecture | model_type | reference | codemods | verdict | max error (fp32) | s |\n"
    "|---|---|---|---|---|---|---|"
)
VERDICTS = ("ported", "refused", "does not validate", "no tiny checkpoint", "error", "crash")
REALIZES = "no codemod realizes "
# a spec field research could not classify (refusal.py's term for it): no codemod is
# missing for it, research is (README rows said 'no codemod realizes embedding.scale'
# while codemods/embedding_scale.py exists)
UNCLASSIFIED = "research could not classify "
FULL_SIZE = " (full-size config)"
# no one feature blocks every reference: the closest one's blockers, named as such
# (minimax_m3_vl_text's mlp.glu, which gpt_oss realizes, blocks qwen3_moe)
CLOSEST = re.compile(r"the closest reference, [\w.-]+, does not realize ")
# the steps every port has (not shown in the codemods column)
ROUTINE_STEPS = ("rename-classes", "set-constants", "register-model")
TOTAL = "; total "


def cells(row: dict) -> list[str]:
    """The seven cells of ``row``'s table line."""
    if "cells" in row:
        return row["cells"]
    steps = ", ".join(s for s in row["steps"] if s not in ROUTINE_STEPS)
    verdict = row["verdict"] + (f": {row['detail']}" if row["detail"] and row["verdict"] != "ported" else "")
    error = "-" if row["max_error"] is None else f"{row['max_error']:.1e}"
    return [
        row["architecture"],
        row["model_type"],
        row["reference"] or "-",
        steps or "-",
        verdict,
        error,
        f"{row['seconds']:.1f}",
    ]


def markdown(rows: list[dict], total: str) -> str:
    """The table, its totals (``total``: how long the run took, as said) and
    the features that refuse model types, most frequent first."""
    lines = [HEADER, *("| " + " | ".join(cells(r)) + " |" for r in rows)]
    counts = collections.Counter(r["verdict"] for r in rows)
    ported = sorted({r["architecture"] for r in rows if r["verdict"] == "ported"})
    lines.append("")
    lines.append(
        f"{len(rows)} model types: "
        + ", ".join(f"{n} {v}" for v, n in counts.most_common())
        + f"; {len(ported)} distinct architectures ported{TOTAL}{total}"
    )
    blocked = collections.Counter(f for r in rows for f in r["blocked"])
    if blocked:
        lines += ["", "Unrealized features (model types refused because of each):", ""]
        lines += [f"- `{feature}`: {n}" for feature, n in blocked.most_common()]
    return "\n".join(lines) + "\n"


def refusal_detail(features: list[str], message: str, full_size: bool = False) -> str:
    """A refused row's detail: the features no codemod realizes, then the
    spec fields research could not classify (``message``, the refusal's
    text, calls each 'which research could not classify [field]')."""
    unclassified = [f for f in features if f"which research could not classify [{f}]" in message]
    realized = [f for f in features if f not in unclassified]
    closest = re.search(r"the closest, ([\w.-]+), does not realize ", message)  # refusal.refusal_text
    lead = f"the closest reference, {closest.group(1)}, does not realize " if closest else REALIZES
    parts = [lead + ", ".join(realized)] if realized else []
    parts += [UNCLASSIFIED + ", ".join(unclassified)] if unclassified else []
    return "; ".join(parts) + (FULL_SIZE if full_size else "")


def parse_row(line: str) -> dict | None:
    """A row of a written table (None for any other line)."""
    parts = [p.strip() for p in line.strip().strip("|").split("|")]
    if len(parts) < 7 or parts[0] in ("architecture", "---"):
        return None
    # a verdict's detail may hold "|": the cells around it are fixed
    found = [*parts[:4], " | ".join(parts[4:-2]), *parts[-2:]]
    verdict_cell = found[4]
    verdict = next(
        (v for v in VERDICTS if verdict_cell == v or verdict_cell.startswith(v + ":")), verdict_cell
    )
    detail = verdict_cell[len(verdict) + 1 :].strip()
    blocked: list[str] = []
    if verdict == "refused" and (detail.startswith((REALIZES, UNCLASSIFIED)) or CLOSEST.match(detail)):
        for part in detail.removesuffix(FULL_SIZE).split("; "):
            named = CLOSEST.sub("", part.removeprefix(REALIZES).removeprefix(UNCLASSIFIED), count=1)
            blocked += [f for f in named.split(", ") if f]
    return {
        "architecture": found[0],
        "model_type": found[1],
        "verdict": verdict,
        "blocked": blocked,
        "cells": found,
    }


def parse_table(text: str) -> tuple[list[dict], str | None]:
    """The rows of a written table and the run time its totals line states."""
    rows = [row for line in text.splitlines() if (row := parse_row(line)) is not None]
    total = next(
        (line.split(TOTAL, 1)[1] for line in text.splitlines() if "model types:" in line and TOTAL in line),
        None,
    )
    return rows, total


def merge(old: list[dict], new: list[dict]) -> list[dict]:
    """``old`` with the rows of ``new`` in place of those of their model
    types; model types ``old`` does not have are added; sorted by model type
    (the order ``corpus.py`` runs them in)."""
    by_type = {r["model_type"]: r for r in old}
    by_type.update({r["model_type"]: r for r in new})
    return [by_type[t] for t in sorted(by_type)]


def readme_table(path: Path) -> str:
    """The text between the README's corpus markers."""
    text = path.read_text(encoding="utf-8")
    if README_START not in text or README_END not in text:
        raise SystemExit(f"{path}: no corpus markers ({README_START} ... {README_END})")
    return text.split(README_START, 1)[1].split(README_END, 1)[0]


def update_readme(path: Path, table: str) -> None:
    """Put ``table`` between the README's corpus markers (the rest of the
    file as it is on disk now)."""
    readme_table(path)  # the markers are there
    text = path.read_text(encoding="utf-8")
    head, rest = text.split(README_START, 1)
    _, tail = rest.split(README_END, 1)
    path.write_text(f"{head}{README_START}\n{table}{README_END}{tail}", encoding="utf-8")
