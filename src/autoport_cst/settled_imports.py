"""Heavy imports as one block, kept out of later garbage collections.

Importing transformers' configuration and modeling code creates millions of
objects that live as long as the process. While they are being created the
cyclic garbage collector runs full collections over everything made so far
(each a tenth of a second or more) and frees next to nothing; afterwards
every full collection traverses them again. ``import_settled`` imports a
group of modules with the collector paused, then moves every object alive
(``gc.freeze``) out of later collections, after one collection of what was
there before, so no garbage is frozen with them. A module already imported
costs nothing: when every module of the group is, nothing is collected or
frozen. Meant for a one-shot process (a command): frozen objects that die
in a cycle later are not reclaimed.
"""

from __future__ import annotations

import gc
import importlib
import sys
from collections.abc import Iterable


def import_settled(modules: Iterable[str]) -> list[str]:
    """Import ``modules`` (those not imported yet) with the collector paused
    and freeze what is alive afterwards; returns the modules imported. A
    module that fails to import is left for its user to import and report."""
    new = [name for name in modules if name not in sys.modules]
    if not new:
        return []
    gc.collect()  # the garbage of the work so far, not frozen below
    enabled = gc.isenabled()
    gc.disable()
    imported = []
    try:
        for name in new:
            try:
                importlib.import_module(name)
            except ImportError:
                continue
            imported.append(name)
    finally:
        gc.freeze()
        if enabled:
            gc.enable()
    return imported
