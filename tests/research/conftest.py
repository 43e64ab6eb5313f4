"""Session-scoped tiny checkpoints and their research results."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.research.tiny_models import ARCHITECTURES, build

PUBLIC_CONFIGS = Path(__file__).resolve().parents[2] / "fixtures" / "public_configs"


class TinyModels:
    def __init__(self, root: Path) -> None:
        self.root = root
        self._research: dict[str, object] = {}

    def directory(self, name: str) -> Path:
        directory = self.root / name
        if not (directory / "config.json").is_file():
            build(name, directory)
        return directory

    def research(self, name: str):
        if name not in self._research:
            from autoport_cst.research import research

            self._research[name] = research(str(self.directory(name)))
        return self._research[name]


@pytest.fixture(scope="session")
def tiny(tmp_path_factory) -> TinyModels:
    pytest.importorskip("transformers")
    pytest.importorskip("torch")
    return TinyModels(tmp_path_factory.mktemp("tiny-research"))


@pytest.fixture(scope="session")
def public_research():
    pytest.importorskip("transformers")
    from autoport_cst.research import research

    cache: dict[str, object] = {}

    def get(name: str):
        if name not in cache:
            cache[name] = research(str(PUBLIC_CONFIGS / name))
        return cache[name]

    return get


__all__ = ["ARCHITECTURES"]
