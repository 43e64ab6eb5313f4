"""The corpus's model types, run by a few worker processes at a time.

Each worker is forked from ``corpus.py`` once it has imported torch,
transformers and autoport_cst, so it pays neither an interpreter start nor
those imports, and it runs model type after model type, as the single
process of a one-worker run would, keeping what the earlier ones loaded
(transformers' modeling modules, the research's parsed sources). A worker
takes a model type through its pipe, answers with the row, and takes the
next; one that dies without answering is reported as a crash of that model
type with its exit code, and a new worker takes its place. A worker writes
its output to a log of its own, printed from where a row began when the row
is a crash or an error. Each worker leads a process group of its own (with
the ranks its validations fork), stopped as a whole on Ctrl-C.
"""

from __future__ import annotations

import itertools
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from corpus_runs import new_row, run_one

LOG_TAIL = 30  # lines of a worker's log printed with a crash or an error


@dataclass
class Worker:
    process: Any
    pipe: Any  # the parent's end of the worker's pipe
    log: Path
    pair: tuple[str, str] | None = None  # the model type it runs
    start: float = 0.0
    log_offset: int = 0


def run_forked(
    pairs: list[tuple[str, str]],
    work: Path,
    tp2: bool,
    runs: str,
    workers: int,
    done: Callable[[dict], None],
) -> None:
    """Run ``pairs`` (model type, architecture) in at most ``workers``
    processes, calling ``done`` with each row as it ends."""
    pending = list(pairs)
    started = itertools.count()
    pool = [_start(work, next(started), tp2, runs) for _ in range(min(workers, len(pending)))]
    try:
        for worker in pool:
            _give(worker, pending)
        while any(w.pair for w in pool):
            busy = {w.pipe: w for w in pool if w.pair} | {w.process.sentinel: w for w in pool if w.pair}
            for ready in multiprocessing.connection.wait(list(busy)):
                worker = busy[ready]
                if worker.pair is None:
                    continue  # its pipe and its sentinel were both ready: it died
                done(_row(worker))
                worker.pair = None
                if not worker.process.is_alive():
                    pool[pool.index(worker)] = worker = _start(work, next(started), tp2, runs)
                _give(worker, pending)
    except KeyboardInterrupt:
        for worker in pool:
            _stop(worker)
        raise SystemExit(130) from None
    for worker in pool:
        worker.pipe.send(None)
        worker.process.join()


def _start(work: Path, index: int, tp2: bool, runs: str) -> Worker:
    context = multiprocessing.get_context("fork")
    log = work / f"worker{index}.log"
    parent, child = context.Pipe()
    process = context.Process(
        target=_worker, args=(child, work, tp2, runs, log), name=f"corpus worker {index}"
    )
    process.start()
    child.close()
    return Worker(process, parent, log)


def _give(worker: Worker, pending: list[tuple[str, str]]) -> None:
    """The next model type to ``worker``, if any is left."""
    worker.pair = pending.pop(0) if pending else None
    if worker.pair is not None:
        worker.start = time.perf_counter()
        worker.log_offset = worker.log.stat().st_size if worker.log.is_file() else 0
        worker.pipe.send(worker.pair)


def _worker(pipe: Any, work: Path, tp2: bool, runs: str, log_path: Path) -> None:
    os.setpgid(0, 0)
    torch = sys.modules.get("torch")  # imported before the fork (corpus.PRELOAD)
    if torch is not None:  # the workers share the cores; validations run with one thread anyway
        torch.set_num_threads(1)
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(log, 1)
    os.dup2(log, 2)
    while (pair := pipe.recv()) is not None:
        directory = work / pair[0]
        directory.mkdir(parents=True)
        row = run_one(*pair, directory, tp2, runs)
        sys.stdout.flush()
        sys.stderr.flush()
        pipe.send(row)
        _remove(directory)


def _remove(directory: Path) -> None:
    import shutil

    shutil.rmtree(directory, ignore_errors=True)


def _row(worker: Worker) -> dict:
    """The row of the model type ``worker`` ran (a crash when it died
    without one)."""
    assert worker.pair is not None  # a busy worker
    try:
        row = worker.pipe.recv()
    except (EOFError, OSError):
        worker.process.join()
        row = new_row(*worker.pair)
        row.update(
            verdict="crash",
            detail=f"the worker exited with code {worker.process.exitcode} and no row",
            seconds=time.perf_counter() - worker.start,
        )
    if row["verdict"] in ("crash", "error"):
        _print_log(worker)
    return row


def _print_log(worker: Worker) -> None:
    """The last lines ``worker`` wrote since its model type began."""
    if not worker.log.is_file() or worker.pair is None:
        return
    with worker.log.open("rb") as log:
        log.seek(worker.log_offset)
        lines = log.read().decode("utf-8", errors="replace").splitlines()[-LOG_TAIL:]
    print(f"--- {worker.pair[0]}: the last lines of its worker's log", file=sys.stderr)
    print("\n".join(lines), file=sys.stderr, flush=True)


def _stop(worker: Worker) -> None:
    try:
        os.killpg(worker.process.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    worker.process.join(5)
