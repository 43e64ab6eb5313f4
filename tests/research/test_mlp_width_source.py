"""An MLP width the code computes from other config fields is refused with
those fields named (research/analysis/width_source.py). LFM2's default config
says intermediate_size 128 and Lfm2MLP builds 256 (int(2 * 128 / 3) = 85,
times block_ffn_dim_multiplier 1.0, rounded up to block_multiple_of 256, as
block_auto_adjust_ff_dim is set); the refusal said only 'the code builds 256
where the config says 128 ... a port reads the config's value'."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")


def _refusal(directory, model_type):
    from autoport_cst.port import refusal
    from autoport_cst.research import choose_reference, research

    found = research(str(directory))
    return refusal(found, choose_reference(found.spec, model_type, found.architecture, None))


def test_lfm2_width_names_the_fields_it_is_computed_from(tmp_path):
    import transformers

    from autoport_cst.validate.tiny import build_tiny_checkpoint

    tiny = build_tiny_checkpoint("lfm2", tmp_path / "lfm2", seed=0)
    config = json.loads((tiny.directory / "config.json").read_text())
    model = transformers.AutoModelForCausalLM.from_pretrained(str(tiny.directory))
    built = model.model.layers[0].feed_forward.w1.out_features
    assert (config["intermediate_size"], built) == (128, 256)
    error = _refusal(tiny.directory, "lfm2")
    assert error is not None and "mlp.intermediate_size" in error.features
    text = str(error)
    assert "the code builds 256 where the config says 128" in text
    assert (
        "Lfm2MLP.__init__ computes it from config block_auto_adjust_ff_dim, block_ffn_dim_multiplier, "
        "block_multiple_of, intermediate_size" in text
    )
    assert "no codemod computes the width from other fields" in text


def test_a_width_read_as_given_names_nothing_more(tmp_path):
    from autoport_cst.research import research
    from autoport_cst.validate.tiny import build_tiny_checkpoint

    tiny = build_tiny_checkpoint("qwen2", tmp_path / "qwen2", seed=0)
    found = research(str(tiny.directory))
    code = found.finding("mlp.intermediate_size", "code")
    assert code is not None and code.value == 128
    assert code.evidence.endswith("projection width 128")
