"""The one way this project writes a file: a temporary file in the target's
directory, then ``os.replace``. A reader sees the old file or the new one,
never half of either. (A whole port is written as one transaction on top of
this, in ``apply/writer.py``.)"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; on success it replaces
    ``path`` (keeping an existing file's permissions, giving a new file the
    umask's), on error it is removed."""
    target = Path(path)
    if target.exists() and not target.is_file() and not target.is_dir():
        # a device or a pipe (-o /dev/null, /dev/stdout): write through it; a
        # rename would replace the device node with a regular file
        yield from _through_special_file(target)
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    mode = _new_file_mode()
    with contextlib.suppress(OSError):
        mode = target.stat().st_mode & 0o7777
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, mode)  # mkstemp's 0600 would make every new file private
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _new_file_mode() -> int:
    """The permissions ``open`` gives a new file: 0666 less the umask (0644
    under the usual 022)."""
    umask = os.umask(0o022)
    os.umask(umask)
    return 0o666 & ~umask


def _through_special_file(target: Path) -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="autoport-") as directory:
        tmp = Path(directory) / target.name
        yield tmp
        with open(target, "wb") as out, open(tmp, "rb") as data:
            while chunk := data.read(1 << 20):
                out.write(chunk)


def write_atomic(path: str | os.PathLike[str], data: str | bytes) -> None:
    """Write text (UTF-8) or bytes to ``path`` atomically."""
    with atomic_output(path) as tmp:
        if isinstance(data, bytes):
            tmp.write_bytes(data)
        else:
            tmp.write_text(data, encoding="utf-8")
