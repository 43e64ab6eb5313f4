"""The required architectures whose ports start from the qwen3_moe reference port and
validate with no hand edit (tests/port/required_architectures.py)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from tests.port.required_architectures import (  # noqa: E402
    check_ports_and_validates,
    check_validates_on_two_ranks,
    required,
)

ARCHITECTURES = required(reference="qwen3_moe")


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_ports_and_validates(architecture, required_workdir, request):
    check_ports_and_validates(architecture, required_workdir, request.config)


@pytest.mark.slow
@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_ports_and_validates_on_two_ranks(architecture, required_workdir, request):
    check_validates_on_two_ranks(architecture, required_workdir, request.config)
