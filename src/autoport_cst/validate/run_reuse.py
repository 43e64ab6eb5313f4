"""Whole validation runs shared between identical requests.

``port --tp 2`` validates at TP=1 in fp32, whose follow-ups
(``parallel_checks``) include the TP=2 layout on the same checkpoint, steps,
prompts, seed and prefill mode; the explicit ``--tp 2`` fp32 run after it is
the same run. Inside ``reusing_validation_runs`` a run asked for with the
same arguments on the same files (the package's and the checkpoint's: path,
size and modification time of each) returns the report of the first instead
of running again. Outside it nothing is kept.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

SMALL_FILE = 1 << 20  # bytes: files up to this size are keyed by their content too
_KEPT: ContextVar[dict[tuple, Any] | None] = ContextVar("kept_validation_runs", default=None)


@contextmanager
def reusing_validation_runs() -> Iterator[None]:
    """Within: validation runs are kept and reused (see the module)."""
    token = _KEPT.set({})
    try:
        yield
    finally:
        _KEPT.reset(token)


def _files(directory: str | Path) -> tuple:
    """The directory and each file under it (bytecode caches apart): its
    path, size and modification time, and the digest of a small file's
    content (a rewritten config.json of the same size)."""
    root = Path(directory).resolve()
    return (str(root), tuple(_file(root, p) for p in sorted(root.rglob("*")) if _counted(p)))


def _counted(path: Path) -> bool:
    return path.is_file() and "__pycache__" not in path.parts


def _file(root: Path, path: Path) -> tuple:
    stat = path.stat()
    digest = hashlib.sha256(path.read_bytes()).hexdigest() if stat.st_size <= SMALL_FILE else None
    return (str(path.relative_to(root)), stat.st_size, stat.st_mtime_ns, digest)


def reused_run(
    model_dir: str | Path, checkpoint_dir: str | Path, options: dict[str, Any], run: Callable[[], Any]
) -> Any:
    """``run()``'s report, or the report of an earlier run of the same
    package and checkpoint with the same ``options`` (hashable values) while
    reusing."""
    kept = _KEPT.get()
    if kept is None:
        return run()
    key = (_files(model_dir), _files(checkpoint_dir), tuple(sorted(options.items())))
    if key not in kept:
        kept[key] = run()
    return kept[key]
