"""End-to-end: the ports of norm offset and placement, embedding scale and multipliers, softcaps and the logits divisor (Gemma, Gemma 2, Granite, OLMo 2) validate against the transformers
architectures that need them (tests/codemods_mlp/mlp_ports.py)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from .mlp_ports import (  # noqa: E402
    check_fails_without_the_codemods,
    check_validates_at_tp1,
    check_validates_at_tp2,
    tp1_params,
    tp2_params,
    without_params,
)

# the fp32 and bf16 (and TP=2) validations of a case share its transformers run
pytestmark = pytest.mark.usefixtures("shared_reference_runs")


@pytest.mark.parametrize("case, dtype", tp1_params("norms_and_scales"))
def test_port_validates_at_tp1(case, dtype, ports, checkpoints, request):
    check_validates_at_tp1(case, dtype, ports, checkpoints, request.config)


@pytest.mark.parametrize("case, dtype", tp2_params("norms_and_scales"))
def test_port_validates_at_tp2(case, dtype, ports, checkpoints):
    check_validates_at_tp2(case, dtype, ports, checkpoints)


@pytest.mark.parametrize("case, where", without_params("norms_and_scales"))
def test_without_the_codemods_validation_fails(case, where, ports, checkpoints):
    check_fails_without_the_codemods(case, where, ports, checkpoints)
