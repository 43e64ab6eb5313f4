"""Helpers shared by the CLI commands: the exit codes, consoles and the error
boundary.

The exit codes mean one thing each, in every command:

- 0: done (the port validates, the plan is written, the files are clean);
- 1: the result is written and it is wrong: the port does not validate or
  cannot load a valid checkpoint (``port``, ``validate``), violations remain
  (``lint``), files differ (``apply --check``);
- 2: the user's input is wrong (a path, a plan, a name, a TP size the rules
  refuse, a corrupt checkpoint), or an internal error; nothing was written;
- 130: interrupted (Ctrl-C); nothing is left half-written;
- 141: the reader of the output went away (``| head``): the command stops
  quietly where its output was cut, as ``cat`` killed by SIGPIPE does
  (128 + 13); never 1, which would say the result is wrong.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn, ParamSpec, TypeVar

import click

from autoport_cst.errors import AutoportError

P = ParamSpec("P")
R = TypeVar("R")

EXIT_OK = 0
EXIT_FOUND = 1
EXIT_ERROR = 2
EXIT_INTERRUPTED = 130
EXIT_OUTPUT_CLOSED = 141  # 128 + SIGPIPE

# Whether the process ends when the command returns: set by ``cli.main``, which
# then exits without collecting (``exit_now``); not by a caller that runs a
# command in its own process (click's CliRunner in the tests).
_ENDS_WITH_COMMAND = {"set": False}


def process_ends_with_command() -> bool:
    return _ENDS_WITH_COMMAND["set"]


def mark_process_ends_with_command() -> None:
    _ENDS_WITH_COMMAND["set"] = True


# Width of output that goes to a file or a pipe (rich's default is 80
# columns, which clips the tables of a CI log); COLUMNS still wins.
PIPE_WIDTH = 200


def _closed_outputs() -> list[int]:
    """Standard output and error (1, 2) whose reader is gone (the ``head``
    of ``| head -1`` has exited): a pipe's write end without a reader polls
    as an error."""
    import select

    if not hasattr(select, "poll"):
        return [1]  # cannot tell: the EPIPE came from writing our output
    poller = select.poll()
    for fd in (1, 2):
        poller.register(fd, select.POLLOUT)
    return [fd for fd, event in poller.poll(0) if event & (select.POLLERR | select.POLLHUP)]


def exit_output_closed() -> NoReturn:
    """Exit 141 without a word: the closed outputs point at /dev/null, so
    that no later write, nor the flush at exit, fails again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    for fd in _closed_outputs() or [1]:
        os.dup2(devnull, fd)
    os.close(devnull)
    raise SystemExit(EXIT_OUTPUT_CLOSED)


def is_output_closed(error: BaseException) -> bool:
    """A BrokenPipeError from writing our own output (not from another
    pipe, such as a rank's)."""
    return isinstance(error, BrokenPipeError) and bool(_closed_outputs())


def _console(stderr: bool):
    from rich.console import Console

    class QuietOnClosedOutput(Console):
        def on_broken_pipe(self) -> None:  # rich's default exits 1
            self.quiet = True
            exit_output_closed()

    console = QuietOnClosedOutput(stderr=stderr, highlight=False, soft_wrap=True)
    if not console.is_terminal and not os.environ.get("COLUMNS"):
        console.width = PIPE_WIDTH
    return console


def stdout_console():
    return _console(stderr=False)


def stderr_console():
    return _console(stderr=True)


def report_error(error: BaseException) -> None:
    from rich.markup import escape

    console = stderr_console()
    text = str(error)
    first, _, rest = text.partition("\n")
    console.print(f"[bold red]error:[/] {escape(first)}")
    if rest:
        console.print(escape(rest))


def describe_unexpected(error: Exception) -> str:
    """One line for an error no command expected. An error of the system
    (a full disk, a missing permission) is named as such with the file it
    concerns, not as our internal error."""
    if isinstance(error, OSError) and error.strerror:
        where = f": {error.filename}" if error.filename else ""
        return f"system error{where}: {error.strerror}"
    return f"internal error: {type(error).__name__}: {error}"


def error_boundary(func: Callable[P, R]) -> Callable[P, R]:
    """Turn an AutoportError into one clear message on stderr and exit code 2.
    Ctrl-C and click's own exits pass through (``LazyGroup.invoke`` maps
    them)."""

    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return func(*args, **kwargs)
        except AutoportError as error:
            report_error(error)
            sys.exit(EXIT_ERROR)
        except (click.exceptions.Exit, click.ClickException, click.exceptions.Abort, SystemExit):
            raise
        except Exception as error:  # an internal error is still exit code 2
            if is_output_closed(error):  # `| head`
                exit_output_closed()
            report_error(RuntimeError(describe_unexpected(error)))
            if "--debug" in sys.argv:
                raise
            sys.exit(EXIT_ERROR)

    return wrapper


def put_back_leftovers(out: Path, restore: bool = True) -> None:
    """Before a command writes a port into ``out``: what an earlier write
    killed before its end left there is put back, said on stderr, or refused
    with how to restore it by hand (``autoport_cst.apply.leftovers``)."""
    from autoport_cst.apply.leftovers import recover_leftovers

    for line in recover_leftovers(out, restore):
        stderr_console().print(f"note: {line}", markup=False)
