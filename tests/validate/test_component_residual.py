"""A sublayer that adds the block's residual itself (BLOOM's attention and
MLP, MPT's MLP, given ``residual``) is recorded without it: the component is
what a port's attention or MLP returns, the residual being added in its
layer."""

from __future__ import annotations

import pytest

from autoport_cst.validate.components import ComponentRecorder, find_components


def test_the_residual_a_sublayer_adds_is_not_recorded():
    torch = pytest.importorskip("torch")
    from transformers import BloomConfig, BloomForCausalLM

    torch.manual_seed(0)
    config = BloomConfig(hidden_size=32, n_head=4, n_layer=2, vocab_size=64)
    model = BloomForCausalLM(config).eval()
    components = [c for c in find_components(model) if c.name in ("layers.0.attention", "layers.0.mlp")]
    assert {c.name for c in components} == {"layers.0.attention", "layers.0.mlp"}
    recorder = ComponentRecorder(model, components)
    projected = {}
    layer = model.transformer.h[0]
    handles = [
        layer.self_attention.dense.register_forward_hook(
            lambda m, a, o: projected.__setitem__("attention", o)
        ),
        layer.mlp.dense_4h_to_h.register_forward_hook(lambda m, a, o: projected.__setitem__("mlp", o)),
    ]
    with torch.no_grad():
        model(input_ids=torch.tensor([[1, 7, 3, 9, 4]]))
    recorder.remove()
    for handle in handles:
        handle.remove()
    for kind in ("attention", "mlp"):
        ((_, recorded),) = recorder.records[f"layers.0.{kind}"]
        # the output projection's result is what the sublayer adds to the residual (dropout off in eval)
        torch.testing.assert_close(recorded, projected[kind], rtol=1e-5, atol=1e-6)


def test_a_module_without_a_residual_argument_is_recorded_as_it_returns():
    torch = pytest.importorskip("torch")
    from torch import nn

    from autoport_cst.validate.components import Component

    model = nn.Sequential(nn.Linear(4, 4))
    recorder = ComponentRecorder(model, [Component("layers.0.mlp", "0")])
    x = torch.randn(2, 4)
    with torch.no_grad():
        expected = model(x)
    recorder.remove()
    ((_, recorded),) = recorder.records["layers.0.mlp"]
    torch.testing.assert_close(recorded, expected)
