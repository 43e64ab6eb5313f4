"""MPT's attention scale from its nested config field ``attn_config.softmax_scale``
(issue 17): transformers' MptAttention sets ``self.softmax_scale =
config.attn_config.softmax_scale`` and, when that is None, ``1 / sqrt(head_dim)``.
Research reads the field from the code (the scores' factor equals the field, or
the attribute held the field's None before the default replaced it), so a port
reads it at run time whichever value its planned config has: the port planned
on a config with softmax_scale 0.2 validates on it (TP=1 fp32/bf16, TP=2, and
the config variant 0.2 -> 0.4) and on a checkpoint that leaves it None; a copy
that ignores the field fails at the first attention. Config dependence varies
the None entries of the attention config by their annotation: a port planned
where softmax_scale is None validates on it set (its config variant), and
clip_qkv, which no port realizes, is guarded by name."""

from __future__ import annotations

import json
import re
import shutil

import pytest

from autoport_cst.port import port
from autoport_cst.research.pipeline import research
from autoport_cst.validate import build_tiny_checkpoint, validate_model

SCALE = 0.2
KEY = "attn_config.softmax_scale"


def _checkpoint(directory, softmax_scale):
    build_tiny_checkpoint("MptForCausalLM", directory, seed=0)
    path = directory / "config.json"
    config = json.loads(path.read_text())
    config["attn_config"]["softmax_scale"] = softmax_scale
    path.write_text(json.dumps(config, indent=2))
    return directory


@pytest.mark.parametrize("softmax_scale", [None, SCALE])
def test_research_reads_the_nested_scale_field(tmp_path, softmax_scale):
    found = research(str(_checkpoint(tmp_path / "mpt", softmax_scale)))
    attention = found.spec.attention
    assert (attention.scale, attention.scale_key, attention.scale_form) == (softmax_scale, KEY, "multiplier")
    evidence = found.decision("attention.scale_key").evidence
    assert "self.softmax_scale = config.attn_config.softmax_scale" in evidence
    assert ("None here: head_dim ** -0.5" in evidence) == (softmax_scale is None)
    assert "attention.scale_key" not in found.unknown


def test_none_entries_of_the_attention_config_are_varied_by_their_annotation():
    from transformers import MptConfig

    from autoport_cst.research.config_dependence import _dict_variations, _part_config
    from autoport_cst.validate.variants import variant_values

    config = MptConfig()
    entries = config.to_dict()["attn_config"]
    varied = {
        f: (v, w)
        for f, v, w, _ in _dict_variations("attn_config", entries, _part_config(config, "attn_config"))
    }
    assert varied["attn_config.clip_qkv"] == (None, 0.5) and varied[KEY] == (None, 0.5)
    values, changed = variant_values({"attn_config": entries}, [KEY], given={KEY: 0.5})
    assert changed == {KEY: (None, 0.5)} and values["attn_config"]["softmax_scale"] == 0.5
    assert variant_values({"attn_config": entries}, [KEY])[1] == {}  # None alone: nothing to try


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("mpt_softmax_scale")


@pytest.fixture(scope="module")
def ported(workdir):
    source = _checkpoint(workdir / "mpt", SCALE)
    return port(str(source), "mpt", workdir / "ports", tp=2, force=True, steps=4)


@pytest.mark.slow
def test_the_port_reads_the_scale_at_run_time(ported):
    assert ported.validated, [(r.tp, r.dtype, r.first_diverging) for r in ported.runs]
    assert [(r.tp, r.dtype) for r in ported.runs] == [(1, "fp32"), (1, "bf16"), (2, "fp32")]
    assert "attention-scale" in ported.steps
    assert ported.variant[KEY] == [SCALE, 2 * SCALE]
    # the port reads the scale, and refuses by name a clip_qkv it was not made for (None here)
    assert [(g.field, g.value, g.expected, g.refused) for g in ported.guards] == [
        ("attn_config.clip_qkv", 0.5, None, True)
    ]
    assert ported.variant_runs and all(r.equivalent for r in ported.variant_runs)
    model = (ported.package_dir / "model.py").read_text()
    assert '(config.attn_config or {}).get("softmax_scale")' in model


@pytest.mark.slow
def test_the_port_validates_where_the_field_is_none(workdir, ported):
    unset = _checkpoint(workdir / "unset", None)
    report = validate_model(ported.package_dir, unset, tp=1, dtype="fp32", steps=4, config_variants=False)
    assert report.equivalent, report.summary()


@pytest.mark.slow
def test_a_port_ignoring_the_scale_fails(workdir, ported):
    wrong = workdir / "ignored" / "mpt"
    shutil.copytree(ported.package_dir, wrong)
    model = wrong / "model.py"
    text, count = re.subn(
        r"self\.scaling = \(\n.*?\n\s*\)\n",
        "self.scaling = self.head_dim**-0.5\n",
        model.read_text(),
        flags=re.S,
    )
    assert count == 1
    model.write_text(text)
    report = validate_model(wrong, ported.checkpoint_dir, tp=1, dtype="fp32", steps=4, config_variants=False)
    assert not report.equivalent
    assert report.first_diverging is not None and report.first_diverging.component == "layers.0.attention"
