"""The MoE ports of sigmoid routers with a selection-only routing bias (GLM-4-MoE, Solar Open, HY-V3, dots.llm1, MiniMax-M2): each ports from qwen3_moe with its
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


@pytest.mark.parametrize("architecture", architectures("sigmoid_routers", KNOWN_WRONG | WRONG_ON_A_VARIANT))
def test_port_validates(ported, tiny_moe, architecture):
    check_port_validates(ported, tiny_moe, architecture)


@pytest.mark.slow
@pytest.mark.parametrize("architecture", architectures("sigmoid_routers"))
def test_port_validates_on_two_ranks(ported, architecture):
    check_validates_on_two_ranks(ported, architecture)


# slow: by default, the TP=2 and EP 2 layouts among the follow-ups of Glm4Moe's TP=1
# port (FULLY_VALIDATED), and `port --tp 2` in tests/port/test_port_cli.py::test_port_at_tp2
@pytest.mark.slow
def test_glm4_moe_validates_on_two_ranks(ported):
    check_validates_on_two_ranks(ported, "Glm4MoeForCausalLM")
