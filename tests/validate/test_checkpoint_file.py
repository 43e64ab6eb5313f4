"""A tiny checkpoint's weights file is the same bytes for the same tensors."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from autoport_cst.validate.checkpoint_file import save_state


def test_same_state_same_bytes_whatever_the_metadata_order(tmp_path: Path) -> None:
    state = {"b": torch.arange(6.0).reshape(2, 3), "a": torch.ones(4, dtype=torch.bfloat16)}
    metadata = {f"key{i}": str(i) for i in range(12)} | {"format": "pt"}
    written = []
    for i in range(8):
        path = tmp_path / f"w{i}.safetensors"
        save_state(state, path, dict(reversed(metadata.items())) if i % 2 else metadata)
        written.append(path.read_bytes())
    assert all(data == written[0] for data in written)
    loaded = load_file(tmp_path / "w0.safetensors")
    assert torch.equal(loaded["b"], state["b"]) and torch.equal(loaded["a"], state["a"])
    with safe_open(tmp_path / "w1.safetensors", "pt") as handle:
        assert handle.metadata() == metadata
