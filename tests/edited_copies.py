"""A model package copied with text edits: the wrong ports (mutants) the tests build."""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from pathlib import Path


def edited_copy(
    package: Path, target: Path, edits: Iterable[tuple[str, str]], file: str = "model.py"
) -> Path:
    """``package`` copied to ``target`` (without bytecode caches), each ``(old,
    new)`` of ``edits`` applied in turn to its ``file``; an ``old`` that does
    not occur there exactly once fails the test. Returns ``target``."""
    shutil.copytree(package, target, ignore=shutil.ignore_patterns("__pycache__"))
    path = target / file
    text = path.read_text(encoding="utf-8")
    for old, new in edits:
        assert text.count(old) == 1, f"{path.name}: the edit anchor must occur once: {old!r}"
        text = text.replace(old, new)
    path.write_text(text, encoding="utf-8")
    return target
