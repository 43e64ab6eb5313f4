"""What a port write killed before its end leaves under OUT, put back.

``writer.write_port_pending`` keeps the files a port replaces in
``OUT/.autoport-backup-*`` until the run commits or rolls back; a run
killed in between (SIGKILL, a power cut) leaves that folder, the run's
unvalidated files in place and maybe ``OUT/.autoport-stage-*``. Before
moving anything, the write records in the backup folder (``MANIFEST``) its
process, and for each file it writes or removes whether the file existed
and the SHA-256 of what it writes.

The next write into the same OUT (``apply``, ``port``, ``write_port``)
puts the earlier files back by itself when that is unambiguous: the run
that made the folder, on this host, is no longer running, and every file it
touched is either as it was before or as the run wrote it (the directories
the run recorded it was making beside the port, ``port``'s tiny checkpoints,
are removed with it); a folder killed before its record was written holds
nothing and is removed. Otherwise nothing is changed and the user is told what the folder is and how to restore or
remove it by hand (exit 2): a folder without a record (written by an older
autoport-cst), a file changed since, or a run still going.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import time
from pathlib import Path

from autoport_cst.errors import InputError, Position

MANIFEST = ".autoport-write.json"
BACKUP_PREFIX = ".autoport-backup-"


def write_manifest(
    out_dir: Path, backups: Path, staging: Path, written: dict[str, str], removed: list[str]
) -> None:
    """Record the write about to happen (before its first move)."""
    files = {
        rel: {"existed": (out_dir / rel).exists(), "sha256": _digest(text)} for rel, text in written.items()
    }
    files.update({rel: {"existed": True, "sha256": None} for rel in removed})
    created = sorted({parent.as_posix() for rel in written for parent in Path(rel).parents} - {"."})
    record = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "staging": staging.name,
        "files": files,
        "created_dirs": [d for d in created if not (out_dir / d).exists()],
    }
    _write_record(backups, record)


def record_trees(out_dir: Path, backups: Path, trees: list[Path]) -> None:
    """Add to the record of a pending write the directories its run is about
    to make beside the port (``port``'s tiny checkpoints under
    OUT/checkpoints); those that exist already are not the run's."""
    record = _read_record(backups)
    if record is None:
        return
    new = [tree.relative_to(out_dir) for tree in trees if not tree.exists()]
    record["created_trees"] = [*record.get("created_trees", []), *(rel.as_posix() for rel in new)]
    parents = {parent.as_posix() for rel in new for parent in rel.parents} - {"."}
    missing = {d for d in parents if not (out_dir / d).exists()}
    record["created_dirs"] = sorted({*record.get("created_dirs", []), *missing})
    _write_record(backups, record)


def _write_record(backups: Path, record: dict) -> None:
    staged = backups / (MANIFEST + ".tmp")
    staged.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    os.replace(staged, backups / MANIFEST)  # a kill leaves the old record or the new one


def recover_leftovers(out_dir: Path, restore: bool = True) -> list[str]:
    """Put back what killed writes left under ``out_dir`` (see the module
    docstring); one line per folder restored. Raises InputError, changing
    nothing, for a folder it cannot restore safely, or for any folder when
    ``restore`` is False (``apply --check`` writes nothing)."""
    out_dir = Path(out_dir)
    if not out_dir.is_dir():
        return []
    restored = []
    for backup in sorted(out_dir.glob(BACKUP_PREFIX + "*")):
        record = _read_record(backup)
        if record is None and _holds_nothing(backup):  # killed before its record was in place
            _remove_empty(out_dir, backup)
            restored.append(
                f"{out_dir}: removed {backup.name}, left by a write killed before it moved anything"
            )
            continue
        problem = _problem(out_dir, backup, record)
        if problem is not None:
            raise InputError(_by_hand(out_dir, backup, problem), Position(str(backup)))
        assert record is not None
        if not restore:
            raise InputError(
                f"the files an interrupted write (pid {record['pid']}, {record['started']}) replaced under "
                f"{out_dir} are kept here; run without --check to put them back first",
                Position(str(backup)),
            )
        _restore(out_dir, backup, record)
        restored.append(
            f"{out_dir}: put back the port files that a write killed before its end (pid {record['pid']}, "
            f"started {record['started']}) had replaced or added ({len(record['files'])} files; "
            f"its backup {backup.name} removed)"
        )
    return restored


def _holds_nothing(backup: Path) -> bool:
    """No file but a half-written record: the write moved nothing yet."""
    return all(p.is_dir() or p.name == MANIFEST + ".tmp" for p in backup.rglob("*"))


def _remove_empty(out_dir: Path, backup: Path) -> None:
    shutil.rmtree(backup)
    for staging in out_dir.glob(".autoport-stage-*"):
        if not any(p.is_file() for p in staging.rglob("*")):
            shutil.rmtree(staging, ignore_errors=True)


def _read_record(backup: Path) -> dict | None:
    try:
        record = json.loads((backup / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and isinstance(record.get("files"), dict) else None


def _problem(out_dir: Path, backup: Path, record: dict | None) -> str | None:
    """Why the folder cannot be put back by itself (None: it can)."""
    if record is None:
        return "it has no record of the write that made it (an older autoport-cst, or a write that had ended)"
    if record.get("host") != socket.gethostname():
        return f"it was made on another host ({record.get('host')}), where it may still be running"
    if _running(record.get("pid")):
        return (
            f"the autoport-cst process that made it (pid {record['pid']}, started {record['started']}) is "
            "still running: let it end first"
        )
    for rel, entry in record["files"].items():
        state = _state(out_dir / rel, entry.get("sha256"))
        if (backup / rel).exists():
            if state not in ("written", "absent"):
                return f"{rel} was changed after the interrupted write"
        elif not entry.get("existed") and state not in ("written", "absent"):
            return f"{rel} was changed after the interrupted write"
    return None


def _state(target: Path, sha256: str | None) -> str:
    if not target.is_file():
        return "absent"
    if sha256 is not None and _digest(target.read_bytes()) == sha256:
        return "written"
    return "other"


def _restore(out_dir: Path, backup: Path, record: dict) -> None:
    from autoport_cst.interrupts import interrupts_deferred

    with interrupts_deferred():
        for rel, entry in record["files"].items():
            target, kept = out_dir / rel, backup / rel
            if kept.exists():
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(kept, target)
            elif not entry.get("existed"):
                target.unlink(missing_ok=True)
        for rel in record.get("created_trees", []):  # the run's own, e.g. its tiny checkpoints
            shutil.rmtree(out_dir / rel, ignore_errors=True)
        for rel in sorted(record.get("created_dirs", []), key=len, reverse=True):
            shutil.rmtree(out_dir / rel / "__pycache__", ignore_errors=True)
            try:
                (out_dir / rel).rmdir()
            except OSError:  # gone already, or holds files of another write
                pass
        staging = record.get("staging")
        if isinstance(staging, str) and staging.startswith(".autoport-stage-"):
            shutil.rmtree(out_dir / staging, ignore_errors=True)
        shutil.rmtree(backup)


def _by_hand(out_dir: Path, backup: Path, problem: str) -> str:
    return (
        f"a write of a port into {out_dir} was interrupted before its end (killed?) and left this folder: it "
        f"holds the files that write replaced or removed, laid out as under {out_dir}; the files in place "
        f"are that write's. It is not put back by itself: {problem}. To put the earlier files back: "
        f"rm -f {backup}/{MANIFEST} && cp -a {backup}/. {out_dir}/ && rm -r {backup} (files the write "
        f"added stay: compare with git or remove them by hand); to keep the files in place: rm -r {backup}"
    )


def _running(pid: object) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _digest(data: str | bytes) -> str:
    return hashlib.sha256(data.encode("utf-8") if isinstance(data, str) else data).hexdigest()
