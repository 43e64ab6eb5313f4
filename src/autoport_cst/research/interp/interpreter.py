"""The interpreter: its parts (``classes``, ``expressions``, ``statements``,
``calls``) over the shared state of ``core``. See the package's docstring for
the rules of the approximation."""

from __future__ import annotations

from autoport_cst.research.interp.calls import Calls


class Interpreter(Calls):
    """Runs methods of source classes. One interpreter per configuration."""
