"""Ctrl-C during ``autoport-cst lint -j``: exit 130 at once, the workers
gone, nothing half-written (issue 18, item 4)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

BLOCK = """
class Block{i}(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.scale = config.hidden_size ** -0.5

    def forward(self, hidden_states, mask=None):
        x = self.proj(hidden_states) * self.scale
        if mask is not None:
            x = x.masked_fill(mask, float("-inf"))
        return torch.softmax(x, dim=-1) @ hidden_states
"""
FILES = 1500  # of about 0.3 s of CPU each: chunks of 93 files for two workers


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(child) for child in text.split()]


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def _tree(tmp_path: Path) -> Path:
    tree = tmp_path / "tree"
    tree.mkdir()
    first = tree / "m0.py"
    first.write_text("import torch\nfrom torch import nn\n" + "".join(BLOCK.format(i=i) for i in range(40)))
    for index in range(1, FILES):
        os.link(first, tree / f"m{index}.py")
    return tree


@linux_only
def test_ctrl_c_during_lint_jobs_exits_130_at_once(tmp_path):
    tree = _tree(tmp_path)
    cache = tmp_path / "cache"
    process = subprocess.Popen(
        [sys.executable, "-m", "autoport_cst", "lint", "-j", "2", "--cache-dir", str(cache), str(tree)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's job
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 120
        while len(_children(process.pid)) < 2 and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        workers = _children(process.pid)
        assert len(workers) >= 2, "the workers never started"
        time.sleep(1.0)  # the workers are in their first chunk
        assert process.poll() is None
        sent = time.monotonic()
        os.killpg(process.pid, signal.SIGINT)  # Ctrl-C: the whole foreground group
        code = process.wait(timeout=120)
        took = time.monotonic() - sent
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    stderr = process.stderr.read() if process.stderr else ""
    assert code == 130, stderr
    assert took < 10, f"exited {took:.1f} s after Ctrl-C"  # was 20-60 s: the chunks ran to their end
    assert "interrupted (Ctrl-C)" in stderr
    assert "Traceback" not in stderr, stderr
    assert not [pid for pid in workers if _running(pid)], "workers left running"
    assert not cache.exists() or not [p for p in cache.iterdir() if p.name.endswith(".tmp")]
