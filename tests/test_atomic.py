"""Writing files: atomically for regular files, straight through for devices
and pipes (``-o /dev/null`` must not replace the device with a file)."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from autoport_cst.atomic import write_atomic


def test_a_regular_file_is_replaced_keeping_its_mode(tmp_path: Path) -> None:
    target = tmp_path / "plan.json"
    target.write_text("old")
    target.chmod(0o640)
    write_atomic(target, "new")
    assert target.read_text() == "new"
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert [p.name for p in tmp_path.iterdir()] == ["plan.json"]  # no temporary left behind


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
def test_a_pipe_is_written_through_and_stays_a_pipe(tmp_path: Path) -> None:
    pipe = tmp_path / "out.fifo"
    os.mkfifo(pipe)
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(pipe.read_bytes()))
    reader.start()
    write_atomic(pipe, "through the pipe")
    reader.join(timeout=10)
    assert received == [b"through the pipe"]
    assert stat.S_ISFIFO(pipe.stat().st_mode)
    assert [p.name for p in tmp_path.iterdir()] == ["out.fifo"]


def test_dev_null_stays_a_device() -> None:
    null = Path(os.devnull)
    if not null.is_char_device():
        pytest.skip(f"{null} is not a character device here")
    write_atomic(null, "discarded")
    assert null.is_char_device()
