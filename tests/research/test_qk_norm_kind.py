"""q/k norms a port builds with its layer norms' class: research refuses
those that compute another norm (kind or bias) than the layer norms, and
lets through RMSNorms beside RMSNorm layers and Persimmon's LayerNorms with
bias beside LayerNorm layers with bias (decide/unsupported)."""

from __future__ import annotations

import pytest

from autoport_cst.research.decide.unsupported import _qk_norm_kind_differs
from autoport_cst.research.findings import CODE, known


class _Code:
    """The code findings a decision reads, by field."""

    def __init__(self, **values):
        self.values = {name.replace("__", "."): value for name, value in values.items()}

    def code_finding(self, name):
        if name not in self.values:
            return None
        return known(self.values[name], name, CODE, f"{name} read as {self.values[name]}")


def _layers(kind: str, bias: bool) -> dict:
    return {"norm__kind": kind, "norm__bias": bias}


@pytest.mark.parametrize(
    "qk, layers",
    [
        ({}, _layers("rmsnorm", False)),  # Qwen3, OLMo 2: RMSNorms (no kind finding)
        (
            {"code__qk_norm_kind": "layernorm", "code__qk_norm_bias": True},
            _layers("layernorm", True),
        ),  # Persimmon
        (
            {"code__qk_norm_kind": "layernorm", "code__qk_norm_bias": False},
            _layers("layernorm", False),
        ),
    ],
)
def test_qk_norms_of_the_layer_norms_kind_are_not_refused(qk, layers):
    decision = _Code(attention__qk_norm="per_head", **qk, **layers)
    assert _qk_norm_kind_differs(decision) is None


@pytest.mark.parametrize(
    "qk, layers, words",
    [
        (
            {"code__qk_norm_kind": "layernorm", "code__qk_norm_bias": True},
            _layers("layernorm", False),
            "q/k norms that are not RMSNorms",
        ),
        (
            {"code__qk_norm_kind": "layernorm", "code__qk_norm_bias": True},
            _layers("rmsnorm", False),
            "not RMSNorms",
        ),
        ({"code__qk_norm_kind": "layernorm"}, _layers("layernorm", True), "not RMSNorms"),  # bias not read
        ({}, _layers("layernorm", True), "q/k RMSNorms beside layernorm layer norms"),
    ],
)
def test_qk_norms_unlike_the_layer_norms_are_refused(qk, layers, words):
    decision = _Code(attention__qk_norm="per_head", **qk, **layers)
    refusal = _qk_norm_kind_differs(decision)
    assert refusal is not None and words in refusal


def test_no_qk_norms_nothing_to_compare():
    assert _qk_norm_kind_differs(_Code(attention__qk_norm="none", **_layers("layernorm", True))) is None
