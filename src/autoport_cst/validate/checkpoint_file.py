"""Writing a tiny checkpoint's ``model.safetensors`` byte for byte the same
for the same tensors.

safetensors writes its ``__metadata__`` entries in an order that varies from
one call to the next (a hash map), so two saves of the same state could
differ in their header. The header is rewritten here with the metadata keys
sorted; it keeps its length (same entries, same compact JSON), so the tensor
data offsets stay valid.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

_LENGTH = struct.Struct("<Q")


def save_state(state: dict[str, Any], path: str | Path, metadata: dict[str, str]) -> None:
    """Save ``state`` to ``path`` with ``metadata``, the header in one order."""
    from safetensors.torch import save_file

    save_file(state, str(path), metadata=metadata)
    _sort_metadata(Path(path))


def _sort_metadata(path: Path) -> None:
    with path.open("r+b") as handle:
        (length,) = _LENGTH.unpack(handle.read(_LENGTH.size))
        raw = handle.read(length)
        header = json.loads(raw)
        if "__metadata__" in header:
            header["__metadata__"] = dict(sorted(header["__metadata__"].items()))
        text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
        if len(text) > length:
            raise AssertionError(f"{path}: the sorted safetensors header grew ({len(text)} > {length} bytes)")
        handle.seek(_LENGTH.size)
        handle.write(text.ljust(length, b" "))
