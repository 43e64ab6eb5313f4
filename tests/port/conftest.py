"""Fixtures of the port tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def required_workdir(tmp_path_factory) -> Path:
    """A directory of the module's tiny checkpoints and ports
    (tests/port/required_architectures.py)."""
    return tmp_path_factory.mktemp("required")
