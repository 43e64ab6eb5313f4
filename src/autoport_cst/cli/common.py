"""Helpers shared by the CLI commands: consoles and the error boundary."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

from autoport_cst.errors import AutoportError

F = TypeVar("F", bound=Callable[..., Any])

EXIT_OK = 0
EXIT_FOUND = 1
EXIT_ERROR = 2


def stdout_console():
    from rich.console import Console

    return Console(highlight=False, soft_wrap=True)


def stderr_console():
    from rich.console import Console

    return Console(stderr=True, highlight=False, soft_wrap=True)


def report_error(error: BaseException) -> None:
    from rich.markup import escape

    console = stderr_console()
    text = str(error)
    first, _, rest = text.partition("\n")
    console.print(f"[bold red]error:[/] {escape(first)}")
    if rest:
        console.print(escape(rest))


def error_boundary(func: F) -> F:
    """Turn an AutoportError into one clear message on stderr and exit code 2."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except AutoportError as error:
            report_error(error)
            sys.exit(EXIT_ERROR)
        except (click.exceptions.Exit, click.ClickException, SystemExit):
            raise
        except Exception as error:  # an internal error is still exit code 2
            report_error(RuntimeError(f"internal error: {type(error).__name__}: {error}"))
            if "--debug" in sys.argv:
                raise
            sys.exit(EXIT_ERROR)

    return wrapper  # type: ignore[return-value]
