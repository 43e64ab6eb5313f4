"""Write a port to disk: all of it or nothing.

Every file goes through one transaction: contents are staged as temporary
files next to their targets, then moved into place with ``os.replace``;
replaced files are kept aside until the end and restored if any move fails.
With ``force``, files of an existing model package that the new port no
longer has are removed in the same transaction. ``write_port_pending`` keeps the replaced
files aside until the caller commits or rolls back: ``port`` keeps the
port only once it has a verdict.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from autoport_cst.apply.leftovers import MANIFEST, record_trees, recover_leftovers, write_manifest
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
    """Write the port whole, or leave the files as they were."""
    pending = write_port_pending(out_dir, files, package_dir, force)
    pending.commit()
    return pending.report


@dataclass
class PendingWrite:
    """A port moved into place whose replaced files are still kept aside
    (``port`` validates it before keeping it): :meth:`commit` drops them,
    :meth:`rollback` puts them back and removes the files and directories
    that were new, so an earlier port is left as it was and none is left
    where there was none."""

    report: WriteReport
    moved: list[tuple[Path, Path | None]] = field(default_factory=list)  # (target, backup or None if new)
    created_dirs: list[Path] = field(default_factory=list)
    scratch: list[Path] = field(default_factory=list)  # the staging and backup directories

    def commit(self) -> None:
        for directory in self.scratch:  # the manifest first: a backup without one is no pending write
            (directory / MANIFEST).unlink(missing_ok=True)
        for directory in self.scratch:
            shutil.rmtree(directory, ignore_errors=True)
        self.moved.clear()
        self.created_dirs.clear()

    def will_create(self, out_dir: Path, directories: list[Path]) -> None:
        """Directories the caller is about to make beside the port (``port``'s
        tiny checkpoints): a run killed before :meth:`commit` or
        :meth:`rollback` has them removed too when its write is put back
        (``apply.leftovers``)."""
        if self.scratch:
            record_trees(Path(out_dir), self.scratch[-1], directories)

    def rollback(self) -> None:
        for target, backup in reversed(self.moved):
            if backup is not None and backup.exists():
                os.replace(backup, target)
            elif target.exists():
                target.unlink()
        for directory in reversed(self.created_dirs):
            # a new directory holds only this write's files, and the
            # bytecode of the modules imported from them since
            shutil.rmtree(directory / "__pycache__", ignore_errors=True)
            try:
                directory.rmdir()
            except OSError:
                pass
        self.commit()


def write_port_pending(out_dir: Path, files: dict[str, str], package_dir: str, force: bool) -> PendingWrite:
    """Move the port's files into place, keeping the files they replace
    aside until the caller commits or rolls back (a failed move rolls back
    at once)."""
    out_dir = Path(out_dir)
    package = out_dir / package_dir
    if out_dir.exists() and not out_dir.is_dir():
        raise InputError(f"output path {out_dir} exists and is not a directory")
    recover_leftovers(out_dir)  # a write killed before its end: put back, or refused with how to
    pending = differences(out_dir, files, package_dir) if out_dir.is_dir() else sorted(files)
    if package.exists() and pending and not force:
        raise InputError(f"{package} already exists and differs from this port; use --force to replace it")
    to_write = [rel for rel in pending if rel in files]
    stale = [rel for rel in pending if rel not in files]
    unchanged = tuple(sorted(set(files) - set(to_write)))
    if not to_write and not stale:
        return PendingWrite(WriteReport((), unchanged, ()))
    out_dir.mkdir(parents=True, exist_ok=True)
    backups = Path(tempfile.mkdtemp(prefix=".autoport-backup-", dir=out_dir))
    staging = Path(tempfile.mkdtemp(prefix=".autoport-stage-", dir=out_dir))
    write = PendingWrite(WriteReport(tuple(to_write), unchanged, tuple(stale)), scratch=[staging, backups])
    try:
        # what a run killed before commit/rollback leaves is put back from this (apply.leftovers)
        write_manifest(out_dir, backups, staging, {rel: files[rel] for rel in to_write}, stale)
        _move_into_place(out_dir, files, to_write, stale, write)
    except BaseException:
        write.rollback()
        raise
    shutil.rmtree(staging, ignore_errors=True)
    return write


def _move_into_place(
    out_dir: Path, files: dict[str, str], to_write: list[str], stale: list[str], write: PendingWrite
) -> None:
    staging, backups = write.scratch
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
                write.created_dirs.append(parent)
        backup = None
        if target.exists():
            backup = backups / rel
            backup.parent.mkdir(parents=True, exist_ok=True)
            os.replace(target, backup)
        write.moved.append((target, backup))
        os.replace(staged[rel], target)
    for rel in stale:
        target = out_dir / rel
        backup = backups / rel
        backup.parent.mkdir(parents=True, exist_ok=True)
        os.replace(target, backup)
        write.moved.append((target, backup))
