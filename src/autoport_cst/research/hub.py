"""Resolving a SOURCE argument: a local checkpoint directory, or a Hugging
Face hub id fetched through huggingface_hub (config.json and the
safetensors headers only, by HTTP range requests: no weights are
downloaded). Hub access needs the network (probed first: without it a hub
id fails at once); tests use local directories."""

from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from autoport_cst.errors import InputError
from autoport_cst.research.checkpoint import CheckpointHeader, TensorInfo

HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
HUB_PROBE_TIMEOUT_S = 3.0


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


def hub_unreachable() -> str | None:
    """Why the hub (``HF_ENDPOINT``, or the HTTPS proxy when one is set)
    cannot be reached now, from one TCP connection of at most
    ``HUB_PROBE_TIMEOUT_S``; None when it can. A machine without network
    then fails at once instead of after the hub client's retries."""
    endpoint = os.environ.get("HF_ENDPOINT") or "https://huggingface.co"
    proxy = os.environ.get("HTTPS_PROXY") or os.environ.get("https_proxy")
    url = urlsplit(proxy if proxy and endpoint.startswith("https") else endpoint)
    host, port = url.hostname, url.port or (443 if url.scheme == "https" else 80)
    if not host:
        return f"no host in {endpoint!r}"
    try:
        with socket.create_connection((host, port), timeout=HUB_PROBE_TIMEOUT_S):
            return None
    except OSError as exc:
        return f"cannot connect to {host}:{port}: {exc.strerror or exc}"


def check_hub_reachable(repo_id: str) -> None:
    """InputError at once when ``repo_id`` cannot be fetched: the hub is
    unreachable and HF_HUB_OFFLINE does not ask for the local cache."""
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        return  # the hub client reads its cache only, and fails at once when it misses
    reason = hub_unreachable()
    if reason is not None:
        raise InputError(
            f"{repo_id}: the Hugging Face hub is unreachable ({reason}); pass a local checkpoint "
            "directory (config.json and safetensors), or set HF_HUB_OFFLINE=1 to read the local cache"
        )


def _from_hub(repo_id: str) -> ResolvedSource:
    try:
        from huggingface_hub import HfApi, hf_hub_download
    except ImportError:
        raise InputError(
            f"{repo_id}: reading a hub model needs huggingface_hub (pip install huggingface_hub)"
        ) from None
    check_hub_reachable(repo_id)
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
