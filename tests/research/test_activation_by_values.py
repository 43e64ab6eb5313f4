"""An activation module written out in the modeling code (BLOOM's
``BloomGelu``, through an autograd function) is named by its values: those
of one of transformers' activations on a grid, or none."""

from __future__ import annotations

import pytest

from autoport_cst.research.activation_values import activation_by_values


def test_bloom_gelu_is_named_by_its_values(tiny):
    """BloomGelu's values are those of transformers' tanh GELU (within float64
    rounding of its constant 0.79788456), not of the erf GELU."""
    torch = pytest.importorskip("torch")
    from transformers.activations import ACT2FN
    from transformers.models.bloom.modeling_bloom import BloomGelu

    x = torch.linspace(-20, 20, 8001, dtype=torch.float64)
    with torch.no_grad():
        values = BloomGelu()(x)
    torch.testing.assert_close(values, ACT2FN["gelu_pytorch_tanh"](x), rtol=1e-9, atol=1e-9)
    assert (values - ACT2FN["gelu"](x)).abs().max() > 1e-4
    name, worst = activation_by_values("transformers.models.bloom.modeling_bloom", "BloomGelu")
    assert name == "gelu_pytorch_tanh" and worst < 1e-9
    found = tiny.research("bloom")
    assert found.spec.mlp.activation == "gelu_tanh"
    assert "BloomGelu" in found.decision("mlp.activation").evidence


class CubedTanh:
    """An activation no candidate computes."""

    def __call__(self, x):
        return x * x.tanh() ** 3


class NeedsArguments:
    def __init__(self, alpha):
        self.alpha = alpha


def test_an_activation_no_candidate_computes_is_not_named():
    pytest.importorskip("torch")
    assert activation_by_values(__name__, "CubedTanh") is None
    assert activation_by_values(__name__, "NeedsArguments") is None
