"""The transformers side of validations shared between runs on one checkpoint.

Every validation runs transformers on its checkpoint (``api._ReferenceRun``:
the float32 model's greedy teacher tokens, the float32 and bfloat16 outputs
on them), whatever the port's dtype and TP size. ``port`` validates one port
on one checkpoint at TP=1 in fp32 and bf16 (and fp32 at ``--tp``): inside
``reusing_reference_runs`` a run on the same checkpoint files (path, size and
modification time of each), prompts and decode steps takes the outputs of
the first instead of loading and running transformers again. Outside it
nothing is kept.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

_KEPT: ContextVar[dict[tuple, tuple[list[list[int]], dict[str, Any]]] | None] = ContextVar(
    "kept_reference_runs", default=None
)


@contextmanager
def reusing_reference_runs() -> Iterator[None]:
    """Within: reference runs are kept and reused (see the module)."""
    token = _KEPT.set({})
    try:
        yield
    finally:
        _KEPT.reset(token)


@contextmanager
def sharing_reference_runs() -> Iterator[None]:
    """Within: reference runs are reused, in the caller's
    ``reusing_reference_runs`` when one is open, else in one of their own."""
    if _KEPT.get() is not None:
        yield
        return
    with reusing_reference_runs():
        yield


def _key(checkpoint: Path, prompts: tuple[tuple[int, ...], ...], steps: int) -> tuple:
    directory = Path(checkpoint).resolve()
    files = tuple(
        (p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(directory.iterdir()) if p.is_file()
    )
    return (str(directory), files, prompts, steps)


def kept_run(
    checkpoint: Path, prompts: tuple[tuple[int, ...], ...], steps: int
) -> tuple[list[list[int]], dict[str, Any]] | None:
    """(teacher tokens, outputs by dtype name) of an earlier run, or None."""
    kept = _KEPT.get()
    if kept is None:
        return None
    found = kept.get(_key(checkpoint, prompts, steps))
    return None if found is None else ([list(t) for t in found[0]], dict(found[1]))


def keep_run(
    checkpoint: Path,
    prompts: tuple[tuple[int, ...], ...],
    steps: int,
    teacher: list[list[int]],
    outputs: dict[str, Any],
) -> None:
    """Keep a run's teacher tokens and outputs while reusing."""
    kept = _KEPT.get()
    if kept is not None:
        kept[_key(checkpoint, prompts, steps)] = ([list(t) for t in teacher], dict(outputs))
