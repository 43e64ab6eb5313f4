"""Fixtures of the attention / RoPE codemod validations: build a port from a
plan (a dict) onto a reference, and tiny transformers checkpoints from a
config dict (built once per session and cached by content)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def build_port_dir(plan: dict, out: Path, reference: str | None = None) -> Path:
    """Apply ``plan`` and write the port under ``out``; return the package dir."""
    from autoport_cst.apply import build_port, load_reference, write_port
    from autoport_cst.plan import parse_plan

    parsed = parse_plan(plan, "<test plan>")
    ref = load_reference(reference or parsed.reference or "llama3")
    result = build_port(parsed, ref)
    assert result.ok, str(result.failure)
    write_port(out, result.files, result.package_dir, force=True)
    return out / result.package_dir


@pytest.fixture(scope="session")
def port_builder(tmp_path_factory):
    """``build(plan_dict) -> package dir`` (one directory per plan)."""
    cache: dict[str, Path] = {}

    def build(plan: dict, reference: str | None = None) -> Path:
        key = hashlib.sha256(json.dumps([plan, reference], sort_keys=True).encode()).hexdigest()[:16]
        if key not in cache:
            out = tmp_path_factory.mktemp(f"port-{plan['name']}")
            cache[key] = build_port_dir(plan, out, reference)
        return cache[key]

    return build


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    """``make(config_dict, seed=0, after=None) -> checkpoint dir``: a tiny
    random checkpoint of ``config_dict`` (``model_type`` plus whatever the
    test needs, applied before the tiny dimensions); ``after`` are config
    values written into config.json after the weights are built (for values
    the tiny dimensions would override, such as max_position_embeddings)."""
    cache: dict[str, Path] = {}

    def make(config: dict, seed: int = 0, after: dict | None = None) -> Path:
        from autoport_cst.validate import build_tiny_checkpoint

        key = hashlib.sha256(json.dumps([config, seed, after], sort_keys=True).encode()).hexdigest()[:16]
        if key not in cache:
            directory = tmp_path_factory.mktemp(f"tiny-{config['model_type']}")
            source = directory / "source.json"
            source.write_text(json.dumps(config), encoding="utf-8")
            target = directory / "checkpoint"
            build_tiny_checkpoint(source, target, seed=seed)
            if after:
                path = target / "config.json"
                values = json.loads(path.read_text(encoding="utf-8"))
                values.update(after)
                path.write_text(json.dumps(values, indent=2, sort_keys=True) + "\n", encoding="utf-8")
            cache[key] = target
        return cache[key]

    return make
