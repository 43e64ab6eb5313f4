"""A residual add written inside the attention or MLP module (BLOOM's
``dropout_add(output, residual, ...)``, MPT's MLP ``output + residual``) is
the block's residual when the sublayer is given the value its input norm
reads: research then reads the block as pre-norm with the usual residual.
The residual taken after the norm (BLOOM's
``apply_residual_connection_post_layernorm``) is another computation, named
``residual_after_norm``, and the config field is guarded."""

from __future__ import annotations

import json
import shutil

import pytest

from autoport_cst.plan.plan_file import assumptions_of
from autoport_cst.research import research

POST_NORM = "apply_residual_connection_post_layernorm"


@pytest.mark.parametrize("name", ["bloom", "mpt"])
def test_the_residual_inside_the_sublayer_is_the_blocks(tiny, name):
    found = tiny.research(name)
    spec = found.spec
    assert spec.norm.kind == "layernorm" and spec.norm.placement == "pre"
    assert spec.residual.parallel == "none" and spec.residual.multiplier is None
    named = {entry.split(":", 1)[0] for entry in spec.unsupported or ()}
    assert not named & {"sublayer_residual", "residual_after_norm"}, spec.unsupported
    assert not {"norm.kind", "norm.placement", "residual.parallel"} & set(found.unknown)


def test_transformers_adds_the_residual_it_is_given():
    """What research reads, measured: BLOOM's MLP and MPT's MLP return
    ``residual + f(x)`` with ``f`` not reading the residual."""
    torch = pytest.importorskip("torch")
    from transformers import BloomConfig, MptConfig
    from transformers.models.bloom.modeling_bloom import BloomMLP
    from transformers.models.mpt.modeling_mpt import MptMLP

    torch.manual_seed(0)
    x, residual = torch.randn(2, 3, 16), torch.randn(2, 3, 16)
    for mlp in (
        BloomMLP(BloomConfig(hidden_size=16, n_head=2)).eval(),
        MptMLP(MptConfig(d_model=16, n_heads=2)).eval(),
    ):
        with torch.no_grad():
            given, alone = mlp(x, residual), mlp(x, torch.zeros_like(residual))
        torch.testing.assert_close(given - alone, residual, rtol=1e-6, atol=1e-6)


def _bloom_with_residual_after_norm(tiny, tmp_path):
    directory = tmp_path / "bloom_post"
    shutil.copytree(tiny.directory("bloom"), directory)
    config = json.loads((directory / "config.json").read_text())
    config[POST_NORM] = True
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def test_a_residual_taken_after_the_norm_is_named(tiny, tmp_path):
    spec = research(str(_bloom_with_residual_after_norm(tiny, tmp_path))).spec
    (entry,) = [e for e in spec.unsupported or () if e.startswith("residual_after_norm:")]
    assert "BloomAttention.forward" in entry and "BloomMLP.forward" in entry
    assert "(input_layernorm)" in entry and "(post_attention_layernorm)" in entry
    assert not any(e.startswith("sublayer_residual") for e in spec.unsupported or ())


def test_the_flag_is_guarded_where_it_is_false(tiny):
    found = tiny.research("bloom")
    probe = found.config_dependence.probe(POST_NORM)
    assert probe is not None and probe.value is False and probe.changes_computation
    guards = {g.field: g.value for g in assumptions_of(found, "starcoder2").guards}
    assert guards.get(POST_NORM) is False, guards
