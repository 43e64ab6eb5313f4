"""Content-hash cache of lint results.

Key: a hash of the file's bytes and the settings fingerprint (tool version,
a signature of the lint package's files, enabled rules, their options and
the forward-path settings). Value: the file's diagnostics without the path.
A changed file, rule set, option or tool version misses; renaming a file
hits. One JSON file per cache directory, read once and written once per run
(atomically); the directory gets a ``.gitignore`` of ``*``. ``MemoryCache``
keeps the same keys and rows in this process only.
"""

from __future__ import annotations

import hashlib
import json
import os

from autoport_cst.atomic import write_atomic
from autoport_cst.lint.diagnostics import Diagnostic

CACHE_VERSION = 1
MAX_ENTRIES = 50_000
DEFAULT_DIR = ".autoport-cst-cache"


def key(data: bytes, fingerprint: str) -> str:
    digest = hashlib.blake2b(data, digest_size=20)
    digest.update(fingerprint.encode())
    return digest.hexdigest()


class Cache:
    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.path = os.path.join(directory, f"lint-v{CACHE_VERSION}.json")
        self.entries: dict[str, list] = {}
        self.dirty = False
        self.hits = 0
        self._load()

    def _load(self) -> None:
        try:
            with open(self.path, encoding="utf-8") as handle:
                data = json.load(handle)
        except (OSError, ValueError):
            return
        if isinstance(data, dict) and data.get("version") == CACHE_VERSION:
            entries = data.get("entries")
            if isinstance(entries, dict):
                self.entries = entries

    def get(self, cache_key: str, path: str) -> list[Diagnostic] | None:
        rows = self.entries.get(cache_key)
        if rows is None:
            return None
        try:
            out = [Diagnostic.from_row(path, row) for row in rows]
        except (TypeError, ValueError):
            return None
        self.hits += 1
        return out

    def put(self, cache_key: str, diagnostics: list[Diagnostic]) -> None:
        self.entries.pop(cache_key, None)
        self.entries[cache_key] = [d.to_row() for d in diagnostics]
        self.dirty = True

    def save(self) -> None:
        if not self.dirty:
            return
        if len(self.entries) > MAX_ENTRIES:  # keep the most recently written
            self.entries = dict(list(self.entries.items())[-MAX_ENTRIES:])
        try:
            os.makedirs(self.directory, exist_ok=True)
            ignore = os.path.join(self.directory, ".gitignore")
            if not os.path.exists(ignore):
                with open(ignore, "w", encoding="utf-8") as handle:
                    handle.write("# created by autoport-cst lint\n*\n")
            write_atomic(
                self.path,
                json.dumps({"version": CACHE_VERSION, "entries": self.entries}, separators=(",", ":")),
            )
        except OSError:
            pass  # a read-only tree: run without a cache
        self.dirty = False


_MEMORY: dict[str, list] = {}


class MemoryCache(Cache):
    """The cache's keys and rows held in this process, nothing read from or
    written to disk: for a caller that lints the same files again and again
    without a cache directory of its own (the validator's lint gate lints a
    port before each of its validations). A key holds the file's bytes and
    the settings fingerprint, so a changed file, rule set or option misses."""

    def __init__(self) -> None:
        self.directory = ""
        self.path = ""
        self.entries = _MEMORY
        self.dirty = False
        self.hits = 0

    def save(self) -> None:
        while len(self.entries) > MAX_ENTRIES:  # drop the oldest written
            del self.entries[next(iter(self.entries))]
        self.dirty = False
