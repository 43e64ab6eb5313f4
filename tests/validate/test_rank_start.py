"""How TP ranks start: forked from the validating process after it has
imported what a rank runs (Linux), or as fresh interpreters; the same
results either way."""

from __future__ import annotations

import pickle
import signal
import sys
from pathlib import Path

import pytest
import torch

from autoport_cst.errors import InputError
from autoport_cst.validate import validate_model
from autoport_cst.validate.rank_start import START_ENV, start_forked_ranks, start_method

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ranks fork on Linux")


def _wait(ranks, seconds: float = 60.0) -> list[int | None]:
    for rank in ranks:
        rank.process.join(timeout=seconds)
    return [rank.exit_code() for rank in ranks]


def _echo_rank(job_path: Path, rank: int, teacher) -> int:
    """A toy rank: what it received, and whether torch was already imported
    when it started, into a file; a line on its standard error."""
    payload = pickle.load(teacher)
    preloaded = "transformers.models.llama.configuration_llama" in sys.modules
    (job_path.parent / f"out{rank}").write_text(repr((payload, preloaded)))
    print(f"rank {rank} says hello", file=sys.stderr)
    return 3 if rank == 1 else 0


@linux_only
def test_forked_ranks_get_the_teacher_and_keep_their_output_apart(tmp_path, capfd):
    from transformers.models.llama import configuration_llama  # noqa: F401  (the parent's import)

    job = tmp_path / "job.pkl"
    ranks = start_forked_ranks(job, 2, _echo_rank)
    try:
        for rank in ranks:
            rank.send(pickle.dumps([[1, 2], [3]]))
        assert _wait(ranks) == [0, 3]
    finally:
        for rank in ranks:
            rank.stop()
    for rank in range(2):
        assert (tmp_path / f"out{rank}").read_text() == repr(([[1, 2], [3]], True))
        assert ranks[rank].output_tail() == f"rank {rank} says hello"
    assert "says hello" not in capfd.readouterr().err  # not on the parent's stream


def _reads_to_eof(job_path: Path, rank: int, teacher) -> int:
    return 0 if teacher.read() == b"" else 1


@linux_only
def test_a_rank_sees_the_end_of_its_pipe_when_the_parent_stops_without_sending(tmp_path):
    ranks = start_forked_ranks(tmp_path / "job.pkl", 2, _reads_to_eof)
    for rank in ranks:
        rank.teacher.close()
    try:
        assert _wait(ranks, 30) == [0, 0]  # no other process holds a write end
    finally:
        for rank in ranks:
            rank.stop()


# Ctrl-C landing while a rank is forked: the at-fork hook below stands in for
# the terminal's SIGINT arriving during the fork, where Python runs its
# at-fork handlers (logging's among them) and drops what they raise.
CTRL_C_DURING_THE_FORK = """
import os, signal, sys
from pathlib import Path
from autoport_cst.validate.rank_start import start_forked_ranks

def rank_main(job_path, rank, teacher):
    return 0 if signal.getsignal(signal.SIGINT) is signal.default_int_handler else 5

os.register_at_fork(before=lambda: os.kill(os.getpid(), signal.SIGINT))
try:
    ranks = start_forked_ranks(Path(sys.argv[1]) / "job.pkl", 2, rank_main)
except KeyboardInterrupt:
    sys.exit(130)
print("started", len(ranks), "ranks: the Ctrl-C was lost", file=sys.stderr)
sys.exit(0)
"""


@linux_only
def test_ctrl_c_while_the_ranks_are_forked_interrupts_the_parent(tmp_path):
    import subprocess

    root = Path(__file__).resolve().parents[2]
    result = subprocess.run(
        [sys.executable, "-c", CTRL_C_DURING_THE_FORK, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(root / "src"), "PATH": "/usr/bin:/bin"},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as from a terminal
    )
    assert result.returncode == 130, result.stderr
    assert "Exception ignored" not in result.stderr


def _interrupt_default(job_path: Path, rank: int, teacher) -> int:
    return 0 if signal.getsignal(signal.SIGINT) is signal.default_int_handler else 5


@linux_only
def test_a_forked_rank_handles_ctrl_c_as_its_parent_does(tmp_path):
    # the parent as a command run from a terminal has it: Python's default handler (an
    # earlier test in this worker, or a library it imported, may have set another)
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        ranks = start_forked_ranks(tmp_path / "job.pkl", 1, _interrupt_default)
        try:
            assert _wait(ranks, 30) == [0]
        finally:
            for rank in ranks:
                rank.stop()
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the parent's, restored
    finally:
        signal.signal(signal.SIGINT, before)


def _matmul_rank(job_path: Path, rank: int, teacher) -> int:
    x = torch.ones(600, 600)
    return 0 if float((x @ x)[0, 0]) == 600.0 else 1


@linux_only
def test_a_rank_forked_after_the_parent_used_its_thread_pool_runs(tmp_path):
    """Forking after torch's OpenMP pool started hangs a child that enters a
    parallel region of it; a forked rank runs single-threaded."""
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        x = torch.randn(600, 600)
        for _ in range(3):
            x @ x  # the parent's pool is up
        ranks = start_forked_ranks(tmp_path / "job.pkl", 2, _matmul_rank)
        try:
            assert _wait(ranks, 60) == [0, 0]
        finally:
            for rank in ranks:
                rank.stop()
    finally:
        torch.set_num_threads(previous)


def test_start_method(monkeypatch):
    monkeypatch.delenv(START_ENV, raising=False)
    assert start_method() == ("fork" if sys.platform.startswith("linux") else "interpreter")
    monkeypatch.setenv(START_ENV, "interpreter")
    assert start_method() == "interpreter"
    monkeypatch.setenv(START_ENV, "spawn")
    with pytest.raises(InputError, match="expected one of fork, interpreter"):
        start_method()


@pytest.mark.slow
@linux_only
def test_forked_and_interpreter_ranks_give_identical_outputs(llama3_dir, tiny_llama, monkeypatch):
    reports = {}
    for method in ("fork", "interpreter"):
        monkeypatch.setenv(START_ENV, method)
        reports[method] = validate_model(llama3_dir, tiny_llama, dtype="fp32", steps=4, tp=2)
    forked, fresh = reports["fork"], reports["interpreter"]
    assert forked.equivalent and fresh.equivalent, forked.summary()
    one, two = forked.port_output, fresh.port_output
    for a, b in zip(
        one.prefill_logits + one.decode_logits, two.prefill_logits + two.decode_logits, strict=True
    ):
        assert torch.equal(a, b)
    for name, tensors in one.decode_records.items():
        assert all(torch.equal(a, b) for a, b in zip(tensors, two.decode_records[name], strict=True)), name
