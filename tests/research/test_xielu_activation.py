"""xIELU (Apertus: ``ACT2CLS["xielu"](dtype=config.dtype)``) is read as the
MLP activation ``xielu`` (realized by mlp-activation), no longer an
activation without a spec value."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")


def test_apertus_activation_is_xielu_and_planned(tmp_path):
    from autoport_cst.research import research
    from autoport_cst.validate import build_tiny_checkpoint

    build_tiny_checkpoint("ApertusForCausalLM", tmp_path / "apertus")
    found = research(str(tmp_path / "apertus"))
    assert found.spec.mlp.activation == "xielu"
    assert found.spec.mlp.kind == "plain"
    assert "mlp.activation" not in found.unknown
    assert "xielu" in found.decision("mlp.activation").evidence
    assert found.spec.attention.qk_norm == "per_head"
