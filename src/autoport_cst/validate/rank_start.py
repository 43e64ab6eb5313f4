"""How the ranks of a multi-process validation start.

``fork`` (the default on Linux): each rank is forked from the validating
process after it has imported torch, transformers and the modules a rank
runs (the caller's ``preload``), so a rank pays neither an interpreter start
nor those imports: a TP=2 validation costs about what TP=1 does, plus the
ranks' own work. ``interpreter`` (elsewhere, or with
``AUTOPORT_CST_RANK_START=interpreter``): a fresh interpreter per rank,
``python -m autoport_cst.validate.distributed JOB RANK``.

Forking a process whose torch has started intra-op (OpenMP) threads is safe
only while the child never enters a parallel region of that pool: a forked
rank sets one intra-op thread before anything else (and ``_rank_main`` does
in either kind of rank), as the validating process itself does, so results
are the same either way. A
forked rank writes its output to a log file of its own (not the parent's
streams, whose buffers and locks it inherits) and exits without running the
parent's exit handlers.

Both kinds of rank read the teacher tokens (a pickle) from a pipe and are
driven through the same small interface: ``send``, ``exit_code``,
``output_tail``, ``stop``.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, BinaryIO

from autoport_cst.errors import InputError
from autoport_cst.interrupts import forked_while_deferred, interrupts_deferred

START_ENV = "AUTOPORT_CST_RANK_START"
START_METHODS = ("fork", "interpreter")
RankMain = Callable[[Path, int, BinaryIO], int]  # (job file, rank, teacher stream) -> exit code


def start_method() -> str:
    """``AUTOPORT_CST_RANK_START`` when set; else ``fork`` where the
    platform forks safely (Linux), ``interpreter`` elsewhere."""
    chosen = os.environ.get(START_ENV, "").strip()
    if chosen:
        if chosen not in START_METHODS:
            raise InputError(f"{START_ENV}={chosen!r}: expected one of {', '.join(START_METHODS)}")
        return chosen
    forks = sys.platform.startswith("linux") and "fork" in multiprocessing.get_all_start_methods()
    return "fork" if forks else "interpreter"


def _tail(text: str, lines: int) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def _send(stream: IO[bytes], payload: bytes) -> None:
    try:
        stream.write(payload)
        stream.close()
    except (BrokenPipeError, OSError):
        pass  # the rank already stopped; its result file says why


@dataclass
class InterpreterRank:
    """A rank in a fresh interpreter."""

    process: subprocess.Popen

    def send(self, payload: bytes) -> None:
        assert self.process.stdin is not None  # started with stdin=PIPE
        _send(self.process.stdin, payload)

    def exit_code(self) -> int | None:
        return self.process.poll()

    def output_tail(self, lines: int = 15) -> str:
        stream = self.process.stderr
        return _tail(stream.read().decode(errors="replace"), lines) if stream else ""

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=10)
        for stream in (self.process.stderr, self.process.stdin):
            if stream and not stream.closed:
                try:
                    stream.close()
                except OSError:
                    pass


@dataclass
class ForkedRank:
    """A rank forked from the validating process."""

    process: multiprocessing.process.BaseProcess
    teacher: BinaryIO  # write end of the rank's teacher pipe
    log: Path

    def send(self, payload: bytes) -> None:
        _send(self.teacher, payload)

    def exit_code(self) -> int | None:
        return self.process.exitcode

    def output_tail(self, lines: int = 15) -> str:
        return _tail(self.log.read_text(errors="replace"), lines) if self.log.exists() else ""

    def stop(self) -> None:
        if self.process.exitcode is None:
            self.process.kill()
        self.process.join(timeout=10)
        if not self.teacher.closed:
            try:
                self.teacher.close()
            except OSError:
                pass


def start_interpreter_ranks(job_path: Path, world_size: int, package_root: str) -> list[InterpreterRank]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([package_root, *filter(None, [env.get("PYTHONPATH")])])
    env.setdefault("OMP_NUM_THREADS", "1")
    command = [sys.executable, "-m", "autoport_cst.validate.distributed", str(job_path)]
    return [
        InterpreterRank(
            subprocess.Popen(
                [*command, str(rank)],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                env=env,
            )
        )
        for rank in range(world_size)
    ]


def start_forked_ranks(job_path: Path, world_size: int, main: RankMain) -> list[ForkedRank]:
    """Fork ``world_size`` ranks running ``main``; each closes every pipe end
    but its own teacher read end."""
    context = multiprocessing.get_context("fork")
    pipes = [os.pipe() for _ in range(world_size)]
    every_end = [fd for pipe in pipes for fd in pipe]
    ranks: list[ForkedRank] = []
    try:
        with interrupts_deferred():  # a Ctrl-C at a fork is not lost
            for rank, (read_end, write_end) in enumerate(pipes):
                log = job_path.parent / f"rank{rank}.log"
                others = [fd for fd in every_end if fd != read_end]
                process = context.Process(
                    target=_forked_rank,
                    args=(main, job_path, rank, read_end, others, log),
                    name=f"autoport-cst rank {rank}",
                    daemon=True,
                )
                process.start()
                ranks.append(ForkedRank(process, os.fdopen(write_end, "wb"), log))
    except KeyboardInterrupt:
        for started in ranks:
            started.stop()
        raise
    finally:
        for read_end, _ in pipes:
            os.close(read_end)
        for rank in range(len(ranks), world_size):  # write ends of ranks that never started
            os.close(pipes[rank][1])
    return ranks


def _forked_rank(main: RankMain, job_path: Path, rank: int, read_end: int, others: list[int], log: Path):
    if forked_while_deferred():
        signal.signal(signal.SIGINT, signal.default_int_handler)
    torch = sys.modules.get("torch")
    if torch is not None:  # before any tensor work: the parent's OpenMP pool is not the child's
        torch.set_num_threads(1)
    for fd in others:
        os.close(fd)
    _own_output(log)
    with os.fdopen(read_end, "rb") as teacher:
        code = main(job_path, rank, teacher)
    sys.exit(code)


def _own_output(log: Path) -> None:
    """Standard output to /dev/null and standard error to ``log``, through
    new stream objects (the inherited ones may hold the parent's buffered
    text or a lock another parent thread held at the fork)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115 - lives as long as the rank
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
