"""The MoE ports of softmax routers (ERNIE-4.5-MoE, Aria, OLMoE, HunYuan MoE v1): each ports from qwen3_moe with its
expected codemods and validates (tests/coverage_moe/moe_coverage.py)."""

from __future__ import annotations

import pytest

from .moe_coverage import (
    KNOWN_WRONG,
    WRONG_ON_A_VARIANT,
    architectures,
    check_port_validates,
    check_validates_on_two_ranks,
)


@pytest.mark.parametrize("architecture", architectures("softmax_routers", KNOWN_WRONG | WRONG_ON_A_VARIANT))
def test_port_validates(ported, tiny_moe, architecture):
    check_port_validates(ported, tiny_moe, architecture)


@pytest.mark.slow
@pytest.mark.parametrize("architecture", architectures("softmax_routers"))
def test_port_validates_on_two_ranks(ported, architecture):
    check_validates_on_two_ranks(ported, architecture)
