"""ALiBi read from the code (research/analysis/alibi.py, research/alibi_values.py):
the slopes' bias_max by running the builder the backbone calls (MPT's
build_mpt_alibi_tensor with the alibi_bias_max it is called with, BLOOM's
_get_alibi_slopes), for head counts that are powers of two and others; where
the attention adds the bias (after the scale: BLOOM, MPT); and the written-out
attention's scale, sinks, softcap and window read past the bias. What is not
read stays refused as ALiBi, saying why; a bias the backbone also folds into
the mask (Falcon-RW) is named alibi_in_mask."""

from __future__ import annotations

import json
import math
import sys
import types

import pytest

from autoport_cst.research.alibi_values import alibi_bias_max, formula_slopes
from tests.research.tiny_models import ARCHITECTURES, build

CASES = {
    "alibi_mpt": ("mpt", {"d_model": 64, "n_heads": 4, "n_layers": 2}),
    # 12 heads: not a power of two (the slopes of 16 heads, even ones first)
    "alibi_mpt_12": ("mpt", {"d_model": 96, "n_heads": 12, "n_layers": 2}),
    # the config's alibi_bias_max, which MptModel.forward does not pass to its builder
    "alibi_mpt_max16": (
        "mpt",
        {"d_model": 64, "n_heads": 4, "n_layers": 2, "attn_config": {"alibi_bias_max": 16}},
    ),
    "alibi_bloom_6": ("bloom", {"hidden_size": 48, "n_head": 6, "n_layer": 2}),
}


@pytest.fixture(scope="module")
def researched(tmp_path_factory):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from autoport_cst.research import research

    root = tmp_path_factory.mktemp("alibi")
    found = {}
    with pytest.MonkeyPatch.context() as patch:
        for name, entry in CASES.items():
            patch.setitem(ARCHITECTURES, name, entry)
            found[name] = research(str(build(name, root / name)))
    falcon = build("falcon", root / "falcon_rw")
    config = json.loads((falcon / "config.json").read_text())
    (falcon / "config.json").write_text(json.dumps({**config, "alibi": True}))
    found["falcon_rw"] = research(str(falcon))
    return found


@pytest.mark.parametrize("name", sorted(CASES))
def test_alibi_is_read_with_its_slopes_and_the_scores_around_it(researched, name):
    spec = researched[name].spec
    assert spec.attention.alibi_bias_max == 8.0
    assert spec.attention.alibi_scaled is False
    assert not any(e.startswith(("alibi_positions", "explicit_attention")) for e in spec.unsupported or ())
    # the written-out scores, read past the bias: head_dim ** -0.5, no sinks, softcap or window
    assert spec.attention.scale is None and spec.attention.sinks is False and spec.attention.softcap is None
    assert spec.attention.sliding_window == "none"
    evidence = researched[name].decision("attention.alibi_bias_max").evidence
    assert "after the scale" in evidence


def test_the_evidence_names_the_builder_and_the_attention(researched):
    mpt = researched["alibi_mpt"].decision("attention.alibi_bias_max").evidence
    assert "build_mpt_alibi_tensor in MptModel.forward" in mpt and "MptAttention.forward" in mpt
    assert "slope * (position - last position)" in mpt
    bloom = researched["alibi_bloom_6"].decision("attention.alibi_bias_max").evidence
    assert "_get_alibi_slopes in BloomModel.forward" in bloom and "torch.arange" in bloom


def test_mpt_ignores_the_configs_alibi_bias_max(researched):
    """What research reads (8 with the config's 16), measured: MptModel.forward
    builds its bias with the builder's default alibi_bias_max."""
    torch = pytest.importorskip("torch")
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.models.mpt import modeling_mpt

    config = AutoConfig.for_model(
        "mpt", d_model=64, n_heads=4, n_layers=2, attn_config={"alibi_bias_max": 16}
    )
    assert config.attn_config.alibi_bias_max == 16
    model = AutoModelForCausalLM.from_config(config).eval()
    seen = []
    original = modeling_mpt.build_mpt_alibi_tensor

    def spy(*args, **kwargs):
        seen.append(original(*args, **kwargs))
        return seen[-1]

    with pytest.MonkeyPatch.context() as patch, torch.no_grad():
        patch.setattr(modeling_mpt, "build_mpt_alibi_tensor", spy)
        model(input_ids=torch.tensor([[1, 2, 3]]))
    steps = seen[0][:, 0, -1] - seen[0][:, 0, -2]
    torch.testing.assert_close(steps, torch.tensor(formula_slopes(4, 8.0)))
    assert researched["alibi_mpt_max16"].spec.attention.alibi_bias_max == 8.0


def test_falcon_rw_is_refused_for_its_bias_in_the_mask_too(researched):
    """Falcon-RW's backbone folds the bias build_alibi_tensor builds into the
    attention mask: refused as alibi_in_mask, not read as ALiBi, saying what
    the code does with the mask. Up to transformers 5.24 the backbone passes
    the bias as alibi too and the written-out scores add both (named twice);
    since 5.25 the mask, the bias in it divided by sqrt(head_dim), goes to
    the attention function alone. Which of the two the installed code does
    is measured by tests/coverage_dense/test_falcon.py (alibi_adds)."""
    spec = researched["falcon_rw"].spec
    (entry,) = [e for e in spec.unsupported or () if e.startswith("alibi_in_mask")]
    assert "build_alibi_tensor in FalconModel.forward" in entry
    twice = "adds to its scores twice, as attention_mask and as alibi" in entry
    once = "folds, divided by 4, into attention_mask" in entry and "adds it to its scores once" in entry
    assert twice != once, entry
    assert not any(e.startswith(("alibi_positions", "explicit_attention")) for e in spec.unsupported or ())
    assert spec.attention.alibi_bias_max is None


def _module(**functions) -> str:
    module = types.ModuleType("alibi_builders_under_test")
    module.__dict__.update(functions)
    sys.modules[module.__name__] = module
    return module.__name__


def test_slopes_of_another_form_are_not_read():
    torch = pytest.importorskip("torch")

    def linear(heads, device=None):  # slopes 1/h: no ALiBi of one bias_max
        return 1.0 / torch.arange(1, heads + 1, dtype=torch.float32)

    def geometric_power_of_two_only(heads, device=None):  # the paper's formula without the interleave
        return torch.tensor([2.0 ** -(8 * i / heads) for i in range(1, heads + 1)])

    def mpt_like(heads, length, bias_max=6, device=None):
        steps = torch.tensor(formula_slopes(heads, bias_max))
        return steps[:, None, None] * torch.arange(1 - length, 1)[None, None, :]

    name = _module(linear=linear, paper=geometric_power_of_two_only, mpt_like=mpt_like)
    assert alibi_bias_max(name, "linear", (4, None), 0) is None
    assert alibi_bias_max(name, "paper", (4, None), 0) is None  # its 5, 6, 12 and 20 heads differ
    assert alibi_bias_max(name, "mpt_like", (4, 64, 6, None), 0) == (6.0, True)
    assert math.isclose(formula_slopes(8, 6.0)[0], 2**-0.75)
