"""Feedback while a long command works, on stderr: a live rich status (a
spinner, the stage, the time it has taken) on a terminal, and one plain line
per stage when stderr is a file or a pipe (a CI log), so that a minute of
validation never looks like a hang."""

from __future__ import annotations

import sys
import time
from types import TracebackType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID


class StageProgress:
    """``with StageProgress("port") as progress: progress.stage("apply")``."""

    def __init__(self, command: str, console=None) -> None:
        from autoport_cst.cli.common import stderr_console

        self.command = command
        self.console = console or stderr_console()
        self.live = self.console.is_terminal
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        self._current: str | None = None
        self._started = time.perf_counter()
        self._stage_started = self._started

    def __enter__(self) -> StageProgress:
        if self.live:
            from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

            progress = Progress(
                SpinnerColumn(),
                TextColumn("[bold]{task.fields[command]}[/] {task.description}"),
                TimeElapsedColumn(),
                console=self.console,
                transient=True,
            )
            progress.__enter__()
            self._task = progress.add_task("starting", command=self.command, total=None)
            self._progress = progress
        return self

    @property
    def current(self) -> str | None:
        """The stage in progress (None before the first)."""
        return self._current

    def stage(self, label: str) -> None:
        """Report that the stage ``label`` starts (a repeated label is one stage)."""
        if label == self._current:
            return
        now = time.perf_counter()
        if self._progress is not None:
            assert self._task is not None  # added with the live display
            self._progress.update(self._task, description=label)
        else:
            took = f" ({self._current} took {now - self._stage_started:.1f}s)" if self._current else ""
            print(f"{self.command}: {label}...{took}", file=sys.stderr, flush=True)
        self._current = label
        self._stage_started = now

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._progress is not None:
            self._progress.__exit__(kind, error, traceback)
        elif kind is None and self._current is not None:
            total = time.perf_counter() - self._started
            took = f"{self._current} took {time.perf_counter() - self._stage_started:.1f}s"
            print(f"{self.command}: done in {total:.1f}s ({took})", file=sys.stderr, flush=True)
