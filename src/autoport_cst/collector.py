"""The cyclic garbage collector paused around work of bounded size.

A port, an apply or a lint builds and drops hundreds of thousands of
syntax-tree nodes that hold no cycles (reference counting frees them), next
to the long-lived objects of its imports: each cyclic collection would walk
everything made so far and free next to nothing.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic garbage collector disabled while the block runs, and
    restored after (for a caller in the same process) if it was enabled."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
