"""Ctrl-C around forks: the one place that defers it.

Python runs its at-fork handlers (logging's ``_releaseLock`` among them)
around each fork and drops an exception raised in one with "Exception
ignored": a Ctrl-C landing there is lost, and the command goes on as if
nothing happened. Code that forks (validate's ranks, ``lint -j``'s workers)
forks inside :func:`interrupts_deferred`, which records a Ctrl-C and raises
KeyboardInterrupt once the forks are done.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

_DEFERRED: list[int] = []  # the Ctrl-C that came while deferred


def defer_interrupt(signum: int, frame: object) -> None:
    """The SIGINT handler while deferred: records the Ctrl-C."""
    _DEFERRED.append(signum)


def forked_while_deferred() -> bool:
    """True in a child forked inside :func:`interrupts_deferred` (it
    inherited the recording handler and should set its own)."""
    return signal.getsignal(signal.SIGINT) is defer_interrupt


@contextlib.contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Ctrl-C inside the block raises KeyboardInterrupt when the block ends,
    not inside it. Where Ctrl-C does not raise KeyboardInterrupt (ignored,
    another handler, not the main thread) nothing changes."""
    main_thread = threading.current_thread() is threading.main_thread()
    if not main_thread or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield
        return
    _DEFERRED.clear()
    signal.signal(signal.SIGINT, defer_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if _DEFERRED:
        _DEFERRED.clear()
        raise KeyboardInterrupt
