"""A port write killed before its end (SIGKILL between the moves and the
commit, or in the middle of the moves) leaves OUT/.autoport-backup-*: the
next write into OUT puts the earlier files back when that is unambiguous,
and otherwise refuses (exit 2), saying what the folder is and how to
restore or remove it by hand (issue 18)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from autoport_cst.apply.leftovers import recover_leftovers
from autoport_cst.apply.writer import write_port
from autoport_cst.cli import cli
from autoport_cst.errors import InputError

from .conftest import ROOT, run_cli

PACKAGE = "vllm_neuron/model/m"
EARLIER = {
    f"{PACKAGE}/model.py": "v1\n",
    f"{PACKAGE}/old.py": "old\n",
    "vllm_neuron/model/registry.py": "registry 1\n",
    "plans/m.plan.json": "{}\n",
}
LATER = {
    f"{PACKAGE}/model.py": "v2\n",
    f"{PACKAGE}/new.py": "new\n",
    "vllm_neuron/model/registry.py": "registry 2\n",
    "plans/m.plan.json": "{}\n",
    "test/m/test_logits.py": "t\n",
}
# the os.replace calls of LATER over EARLIER with force: the write's record
# first (a kill there leaves an empty backup folder), then the moves:
# model.py 2, new.py 1, registry.py 2, test_logits.py 1, old.py (stale) 1
MOVES = 8

KILLED_WRITE = """
import json, os, signal, sys
from pathlib import Path
from autoport_cst.apply import writer
out, files, package, kill_after = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], int(sys.argv[4])
real, done = os.replace, []
def replace(source, target):
    if len(done) == kill_after:
        os.kill(os.getpid(), signal.SIGKILL)
    done.append(target)
    real(source, target)
os.replace = replace
writer.write_port_pending(Path(out), files, package, force=True)
os.kill(os.getpid(), signal.SIGKILL)  # before commit() or rollback()
"""


def killed_write(out: Path, files: dict, package: str = PACKAGE, kill_after: int = MOVES) -> None:
    process = subprocess.run(
        [sys.executable, "-c", KILLED_WRITE, str(out), json.dumps(files), package, str(kill_after)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        timeout=120,
    )
    assert process.returncode == -signal.SIGKILL, process.stderr


def tree(out: Path) -> dict[str, str]:
    return {
        p.relative_to(out).as_posix(): p.read_text()
        for p in sorted(out.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


@pytest.mark.parametrize("kill_after", [0, 1, 2, 3, 6, MOVES])
def test_the_earlier_port_is_put_back_wherever_the_write_was_killed(tmp_path, kill_after):
    out = tmp_path / "out"
    write_port(out, EARLIER, PACKAGE, force=False)
    before = tree(out)
    killed_write(out, LATER, kill_after=kill_after)
    assert list(out.glob(".autoport-backup-*")), "the killed write left its backup"
    lines = recover_leftovers(out)
    assert len(lines) == 1
    if kill_after == 0:
        assert "left by a write killed before it moved anything" in lines[0]
    else:
        assert "put back the port files that a write killed before its end" in lines[0]
    assert tree(out) == before
    assert not [p.name for p in out.iterdir() if p.name.startswith(".autoport-")]
    assert not (out / "test").exists()


def test_a_file_changed_since_is_refused_with_how_to_restore_by_hand(tmp_path):
    out = tmp_path / "out"
    write_port(out, EARLIER, PACKAGE, force=False)
    killed_write(out, LATER)
    (out / PACKAGE / "model.py").write_text("edited by hand\n")
    after_kill = tree(out)
    with pytest.raises(InputError) as raised:
        recover_leftovers(out)
    message = str(raised.value)
    (backup,) = out.glob(".autoport-backup-*")
    assert message.startswith(f"{backup}: a write of a port into {out} was interrupted")
    assert f"{PACKAGE}/model.py was changed after the interrupted write" in message
    assert f"cp -a {backup}/. {out}/" in message and f"to keep the files in place: rm -r {backup}" in message
    assert tree(out) == after_kill  # nothing changed


def test_a_new_write_puts_the_earlier_port_back_first(tmp_path):
    """apply into an OUT where a port write was killed: the earlier port is
    put back (said on stderr), then the new one written; --check refuses."""
    out = tmp_path / "out"
    plan = ROOT / "examples" / "qwen2.plan.json"
    first = CliRunner().invoke(cli, ["apply", "--plan", str(plan), "--out", str(out)])
    assert first.exit_code == 0, first.output
    applied = tree(out)
    killed_write(out, {"vllm_neuron/model/qwen2/model.py": "broken\n"}, "vllm_neuron/model/qwen2")
    assert tree(out) != applied
    check = CliRunner().invoke(cli, ["apply", "--plan", str(plan), "--out", str(out), "--check"])
    assert check.exit_code == 2, check.output
    assert "run without --check to put them back first" in check.output
    again = CliRunner().invoke(cli, ["apply", "--plan", str(plan), "--out", str(out)])
    assert again.exit_code == 0, again.output
    assert "note: " in again.stderr and "put back the port files" in again.stderr
    assert tree(out) == applied
    assert not list(out.glob(".autoport-*"))


def test_port_refuses_a_backup_without_a_record_before_torch(fake_llama, tmp_path):
    out = tmp_path / "out"
    backup = out / ".autoport-backup-abc123"
    (backup / PACKAGE).mkdir(parents=True)
    (backup / PACKAGE / "model.py").write_text("v1\n")
    result = run_cli("port", fake_llama, "--name", "x", "--out", out)
    assert result.returncode == 2, result.stderr
    assert f"{backup}: a write of a port into {out} was interrupted" in result.stderr
    assert "no record of the write that made it" in result.stderr and f"rm -r {backup}" in result.stderr
    assert result.stderr.rstrip().endswith("torch not imported"), result.stderr
    assert (backup / PACKAGE / "model.py").read_text() == "v1\n"


def test_a_write_still_running_is_left_alone(tmp_path):
    from autoport_cst.apply.writer import write_port_pending

    out = tmp_path / "out"
    write_port(out, EARLIER, PACKAGE, force=False)
    pending = write_port_pending(out, LATER, PACKAGE, force=True)  # this process: still running
    try:
        with pytest.raises(InputError, match="is still running: let it end first"):
            recover_leftovers(out)
    finally:
        pending.rollback()
    assert tree(out) == EARLIER


def test_a_write_made_on_another_host_is_not_put_back(tmp_path):
    """Its process cannot be looked up here: it may still be running."""
    out = tmp_path / "out"
    write_port(out, EARLIER, PACKAGE, force=False)
    killed_write(out, LATER)
    (backup,) = out.glob(".autoport-backup-*")
    record = json.loads((backup / ".autoport-write.json").read_text())
    (backup / ".autoport-write.json").write_text(json.dumps({**record, "host": "elsewhere"}))
    after_kill = tree(out)
    with pytest.raises(
        InputError, match=r"made on another host \(elsewhere\), where it may still be running"
    ):
        recover_leftovers(out)
    assert tree(out) == after_kill


def test_a_killed_first_write_leaves_nothing_once_put_back(tmp_path):
    """Under a fresh OUT the killed write's files and directories all go."""
    out = tmp_path / "out"
    killed_write(out, LATER, kill_after=4)
    assert tree(out)
    recover_leftovers(out)
    assert list(out.iterdir()) == []


def test_port_help_says_what_happens_to_a_killed_run():
    result = CliRunner().invoke(cli, ["port", "--help"])
    text = " ".join(result.output.split())
    assert "none of the tiny checkpoints it made" in text
    assert "what a run killed outright left is put back by the next port or apply" in text
