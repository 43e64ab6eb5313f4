"""Resolving a SOURCE argument: a local checkpoint directory, or a Hugging
Face hub id fetched through huggingface_hub (config.json and the
safetensors headers only, by HTTP range requests: no weights are
downloaded). Hub access needs the network; tests use local directories."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from autoport_cst.errors import InputError
from autoport_cst.research.checkpoint import CheckpointHeader, TensorInfo

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@dataclass(frozen=True)
class ResolvedSource:
    label: str  # what the user gave
    config_path: Path
    directory: Path | None  # local checkpoint directory (None for a hub id)
    header: CheckpointHeader | None = None  # pre-read headers (hub)
    from_hub: bool = False


def resolve_source(source: str) -> ResolvedSource:
    path = Path(source)
    if path.is_dir():
        return ResolvedSource(source, path / "config.json", path)
    if path.is_file():
        if path.name == "config.json":
            return ResolvedSource(source, path, path.parent)
        raise InputError(f"{source}: expected a checkpoint directory (with config.json) or a hub id")
    if HUB_ID.match(source) and not source.startswith((".", "/", "~")):
        return _from_hub(source)
    raise InputError(f"{source}: no such directory, and not a hub id (owner/name)")


def _from_hub(repo_id: str) -> ResolvedSource:
    try:
        from huggingface_hub import HfApi, hf_hub_download
    except ImportError:
        raise InputError(
            f"{repo_id}: reading a hub model needs huggingface_hub (pip install huggingface_hub)"
        ) from None
    try:
        config = Path(hf_hub_download(repo_id, "config.json"))
    except Exception as exc:  # network, auth, missing repo
        raise InputError(
            f"{repo_id}: cannot fetch config.json from the hub ({type(exc).__name__}: {exc})"
        ) from None
    header = None
    try:
        meta = HfApi().get_safetensors_metadata(repo_id)
    except Exception:
        meta = None  # a repo without safetensors: config-only research
    if meta is not None:
        header = CheckpointHeader(f"hub:{repo_id}", tuple(sorted(meta.files_metadata)))
        for file_name, file_meta in sorted(meta.files_metadata.items()):
            for name, info in file_meta.tensors.items():
                header.tensors[name] = TensorInfo(name, info.dtype, tuple(info.shape), file_name)
        header.tensors = dict(sorted(header.tensors.items()))
    return ResolvedSource(repo_id, config, None, header, True)
