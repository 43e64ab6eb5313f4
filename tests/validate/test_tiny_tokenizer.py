"""Tiny checkpoints carry a byte-level tokenizer of their own vocabulary
(validate/tiny_tokenizer.py), built offline."""

from __future__ import annotations

import json

import pytest

from autoport_cst.validate.tiny import build_tiny_checkpoint
from autoport_cst.validate.tiny_tokenizer import MIN_VOCAB, write_tiny_tokenizer

pytest.importorskip("tokenizers")


def _load(directory):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(directory))


def test_vocabulary_is_the_configs_with_specials_at_its_ids(tmp_path):
    values = {"vocab_size": 300, "bos_token_id": 7, "eos_token_id": 299, "pad_token_id": None}
    assert write_tiny_tokenizer(tmp_path, values) == ["tokenizer.json", "tokenizer_config.json"]
    tokenizer = _load(tmp_path)
    assert len(tokenizer) == 300
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id) == (7, 299)
    vocab = tokenizer.get_vocab()
    assert sorted(vocab.values()) == list(range(300))


def test_text_round_trips_and_bos_is_prepended(tmp_path):
    write_tiny_tokenizer(tmp_path, {"vocab_size": 512, "bos_token_id": 1, "eos_token_id": 2})
    tokenizer = _load(tmp_path)
    text = "The capital of France is Paris. ünïcode ✓ 1, 2, 3,"
    ids = tokenizer(text)["input_ids"]
    assert ids[0] == 1
    assert max(ids) < 512
    assert tokenizer.decode(ids, skip_special_tokens=True) == text
    assert len(ids) < len(text.encode()) + 1  # merges were learned


def test_same_config_gives_identical_files(tmp_path):
    values = {"vocab_size": 512, "bos_token_id": 1, "eos_token_id": 2}
    write_tiny_tokenizer(tmp_path / "a", values)
    write_tiny_tokenizer(tmp_path / "b", values)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_a_vocabulary_too_small_for_bytes_gets_no_tokenizer(tmp_path):
    assert write_tiny_tokenizer(tmp_path, {"vocab_size": MIN_VOCAB - 1}) == []
    assert list(tmp_path.iterdir()) == []


def test_tiny_checkpoint_has_a_tokenizer_of_its_vocabulary(tmp_path):
    build_tiny_checkpoint("LlamaForCausalLM", tmp_path, seed=0)
    config = json.loads((tmp_path / "config.json").read_text())
    tokenizer = _load(tmp_path)
    assert len(tokenizer) == config["vocab_size"]
    assert tokenizer.eos_token_id == config["eos_token_id"]
