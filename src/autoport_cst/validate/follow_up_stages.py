"""The follow-up runs of a validation as stages of its progress.

A passing plain validation goes on to its config variants and parallel
layouts (``follow_ups.FollowUps``): a dozen runs, tens of seconds under load. Each
run is announced to the caller's ``on_stage`` as a stage of its own, so a
piped ``validate`` or ``port`` prints a line per run instead of nothing for
a minute (issue 18, item 5).

>>> seen = []
>>> run = announced(lambda checkpoint, **options: checkpoint, seen.append, "parallel layout")
>>> run("ckpt", tp=2, mlp_dp=2)
'ckpt'
>>> run("ckpt", tp=4)
'ckpt'
>>> seen
['parallel layout 1 (tp=2, mlp_dp=2)', 'parallel layout 2 (tp=4)']
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any


def announced(
    run: Callable[..., Any], notify: Callable[[str], None] | None, phase: str
) -> Callable[..., Any]:
    """``run`` (``run(checkpoint, **options)``), each call first reported to
    ``notify`` as ``"<phase> <n> (<options>)"``; ``run`` itself without a
    ``notify``."""
    if notify is None:
        return run
    counter = itertools.count(1)

    def announcing(checkpoint: Any, **options: Any) -> Any:
        given = ", ".join(f"{name}={value}" for name, value in options.items())
        assert notify is not None  # narrowed above
        notify(f"{phase} {next(counter)}" + (f" ({given})" if given else ""))
        return run(checkpoint, **options)

    return announcing
