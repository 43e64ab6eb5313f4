"""Fixtures of the MLP / norm / residual / embedding / LM-head / checkpoint
codemod tests: ports built from plans (in memory, written to a temporary
directory), and tiny transformers checkpoints, both built once per session."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


class Ports:
    """``ports.build(plan_dict_or_example_name)`` -> the port's package directory."""

    def __init__(self, base: pytest.TempPathFactory) -> None:
        self.base = base
        self.cache: dict[str, Path] = {}

    def build(self, plan: str | dict[str, Any]) -> Path:
        from autoport_cst.apply import build_port, load_reference, write_port
        from autoport_cst.plan import load_plan, parse_plan

        key = plan if isinstance(plan, str) else json.dumps(plan, sort_keys=True)
        if key in self.cache:
            return self.cache[key]
        parsed = load_plan(EXAMPLES / f"{plan}.plan.json") if isinstance(plan, str) else parse_plan(plan)
        result = build_port(parsed, load_reference(parsed.reference or "llama3"))
        assert result.ok, str(result.failure)
        out = self.base.mktemp(f"port-{parsed.name}")
        write_port(out, result.files, result.package_dir, force=True)
        package = out / result.package_dir
        self.cache[key] = package
        return package


class Checkpoints:
    """``checkpoints.get(architecture, **config_overrides)`` -> a tiny
    checkpoint directory (config overrides applied before shrinking)."""

    def __init__(self, base: pytest.TempPathFactory) -> None:
        self.base = base
        self.cache: dict[str, Path] = {}

    def get(self, architecture: str, seed: int = 0, **overrides: Any) -> Path:
        key = json.dumps([architecture, seed, overrides], sort_keys=True)
        if key in self.cache:
            return self.cache[key]
        import transformers

        from autoport_cst.validate import build_tiny_checkpoint

        directory = self.base.mktemp(f"tiny-{architecture}")
        source: str | Path = architecture
        if overrides:
            config_class = getattr(transformers, architecture).config_class
            values = config_class(**overrides).to_dict()
            values["architectures"] = [architecture]
            source = directory / "source.json"
            source.write_text(json.dumps(values), encoding="utf-8")
        build_tiny_checkpoint(source, directory / "checkpoint", seed=seed)
        self.cache[key] = directory / "checkpoint"
        return directory / "checkpoint"


@pytest.fixture(scope="session")
def ports(tmp_path_factory) -> Ports:
    return Ports(tmp_path_factory)


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory) -> Checkpoints:
    return Checkpoints(tmp_path_factory)


def plan_dict(
    name: str,
    architecture: str,
    spec: dict,
    reference: str = "llama3",
    steps: list | None = None,
    prefix: str | None = None,
) -> dict[str, Any]:
    data: dict[str, Any] = {
        "version": 1,
        "name": name,
        "architecture": architecture,
        "reference": reference,
        "spec": spec,
    }
    if prefix:
        data["class_prefix"] = prefix
    if steps:
        data["steps"] = steps
    return data
