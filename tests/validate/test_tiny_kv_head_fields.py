"""The shrinker shrinks a KV head count kept under another name than
``num_key_value_heads`` (Falcon's ``num_kv_heads``), read from the field's
name or the class's ``attribute_map``. Before, a Falcon config.json with
``multi_query: false`` shrank to 4 query heads beside 71 KV heads, and the
tiny checkpoint failed to run in transformers."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")


def _falcon_json(tmp_path, **fields):
    from transformers import FalconConfig

    path = tmp_path / "config.json"
    path.write_text(
        json.dumps({**FalconConfig().to_dict(), "architectures": ["FalconForCausalLM"], **fields})
    )
    return str(path)


@pytest.mark.parametrize(
    ("fields", "kv_heads"),
    [
        ({"multi_query": False}, 4),  # 71 of 71: a KV head per query head, as the code needs
        # Falcon-40B: 8 KV heads of 128
        (
            {
                "new_decoder_architecture": True,
                "num_attention_heads": 128,
                "num_kv_heads": 8,
                "hidden_size": 8192,
            },
            2,
        ),
    ],
)
def test_falcon_kv_heads_shrink_and_the_model_runs(tmp_path, fields, kv_heads):
    from transformers import AutoModelForCausalLM

    from autoport_cst.validate.tiny import _tiny_config

    config, _, _ = _tiny_config(_falcon_json(tmp_path, **fields), None)
    assert (config.num_attention_heads, config.num_kv_heads) == (4, kv_heads)
    model = AutoModelForCausalLM.from_config(config)
    assert model(torch.arange(6)[None]).logits.shape == (1, 6, config.vocab_size)


def test_a_given_kv_head_count_is_kept(tmp_path):
    from autoport_cst.validate.tiny import _tiny_config

    config, _, _ = _tiny_config(_falcon_json(tmp_path, new_decoder_architecture=True), {"num_kv_heads": 1})
    assert config.num_kv_heads == 1


def test_kv_head_fields_by_name_and_attribute_map():
    from autoport_cst.validate.tiny_fit import kv_head_fields

    class Mapped:
        attribute_map = {"num_key_value_heads": "n_groups"}

        def __init__(self):
            self.n_groups, self.n_kv_heads, self.num_key_value_heads = 2, 2, 2
            self.indexer_kv_heads, self.num_global_key_value_heads = 1, 1

    assert kv_head_fields(Mapped()) == ["n_groups", "n_kv_heads"]
