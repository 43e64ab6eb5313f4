"""Write a port to disk: all of it or nothing.

Every file goes through one transaction: contents are staged as temporary
files next to their targets, then moved into place with ``os.replace``;
replaced files are kept aside until the end and restored if any move fails.
With ``force``, files of an existing model package that the new port no
longer has are removed in the same transaction.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from autoport_cst.errors import InputError


@dataclass(frozen=True)
class WriteReport:
    written: tuple[str, ...]
    unchanged: tuple[str, ...]
    removed: tuple[str, ...]


def differences(out_dir: Path, files: dict[str, str], package_dir: str) -> list[str]:
    """Output paths whose content on disk differs from ``files`` (missing
    files included), plus stale files inside the package directory."""
    changed = []
    for rel, text in sorted(files.items()):
        path = out_dir / rel
        try:
            if path.read_text(encoding="utf-8") != text:
                changed.append(rel)
        except (FileNotFoundError, UnicodeDecodeError):
            changed.append(rel)
    package = out_dir / package_dir
    if package.is_dir():
        for path in sorted(package.rglob("*")):
            rel = path.relative_to(out_dir).as_posix()
            if path.is_file() and rel not in files and "__pycache__" not in path.parts:
                changed.append(rel)
    return changed


def write_port(out_dir: Path, files: dict[str, str], package_dir: str, force: bool) -> WriteReport:
    out_dir = Path(out_dir)
    package = out_dir / package_dir
    if out_dir.exists() and not out_dir.is_dir():
        raise InputError(f"output path {out_dir} exists and is not a directory")
    pending = differences(out_dir, files, package_dir) if out_dir.is_dir() else sorted(files)
    if package.exists() and pending and not force:
        raise InputError(f"{package} already exists and differs from this port; use --force to replace it")
    to_write = [rel for rel in pending if rel in files]
    stale = [rel for rel in pending if rel not in files]
    unchanged = tuple(sorted(set(files) - set(to_write)))
    if not to_write and not stale:
        return WriteReport((), unchanged, ())
    out_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".autoport-stage-", dir=out_dir))
    backups = Path(tempfile.mkdtemp(prefix=".autoport-backup-", dir=out_dir))
    moved: list[tuple[Path, Path | None]] = []  # (target, backup or None if new)
    created_dirs: list[Path] = []
    try:
        staged = {}
        for rel in to_write:
            tmp = staging / rel
            tmp.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(files[rel], encoding="utf-8")
            staged[rel] = tmp
        for rel in to_write:
            target = out_dir / rel
            for parent in reversed(target.parents):
                if not parent.exists():
                    parent.mkdir()
                    created_dirs.append(parent)
            backup = None
            if target.exists():
                backup = backups / rel
                backup.parent.mkdir(parents=True, exist_ok=True)
                os.replace(target, backup)
            moved.append((target, backup))
            os.replace(staged[rel], target)
        for rel in stale:
            target = out_dir / rel
            backup = backups / rel
            backup.parent.mkdir(parents=True, exist_ok=True)
            os.replace(target, backup)
            moved.append((target, backup))
    except BaseException:
        for target, backup in reversed(moved):
            if backup is not None and backup.exists():
                os.replace(backup, target)
            elif target.exists():
                target.unlink()
        for directory in reversed(created_dirs):
            try:
                directory.rmdir()
            except OSError:
                pass
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        shutil.rmtree(backups, ignore_errors=True)
    return WriteReport(tuple(to_write), unchanged, tuple(stale))
