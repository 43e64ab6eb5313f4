"""A tokenizer for a tiny checkpoint, built offline with the ``tokenizers``
library, so that text goes in and out of a served tiny model without a hub.

Byte-level BPE, as GPT-2, Llama 3 and Qwen use: any text encodes (every byte
has a token), and decoding gives the text back. Its vocabulary has exactly
the config's ``vocab_size`` entries, laid out as follows:

- the config's special tokens at the config's ids: ``bos_token_id`` is
  ``<s>``, ``eos_token_id`` ``</s>``, ``pad_token_id`` ``<pad>`` (an id the
  config does not set is left to the others);
- the 256 byte tokens, then merges learned from a fixed English and code
  text (``CORPUS``), in the free ids in order;
- the ids still free hold ``<|reserved_N|>`` (sampled from a random model,
  they decode to that text).

A BOS token is prepended to every encoded text when the config has one, as
Llama-family tokenizers do. The same vocabulary size and special ids give
byte-identical files.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

MIN_VOCAB = 260  # 256 bytes, the special tokens and a few merges
SPECIALS = (("bos_token_id", "<s>"), ("eos_token_id", "</s>"), ("pad_token_id", "<pad>"))
FILES = ("tokenizer.json", "tokenizer_config.json")

CORPUS = """\
The capital of France is Paris. Once upon a time there was a little model that
counted: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10. It read the prompt, then it wrote the
next token, and the next, until the end of the text.
def fibonacci(n):
    if n < 2:
        return n
    return fibonacci(n - 1) + fibonacci(n - 2)
The quick brown fox jumps over the lazy dog. A serving engine schedules the
requests, fills the cache block by block and samples one token at a time.
for i in range(10):
    print(i, i * i)
"""


def special_ids(config_values: dict[str, Any], vocab_size: int) -> dict[int, str]:
    """The config's special tokens by id (ids outside the vocabulary and
    repeats left out)."""
    chosen: dict[int, str] = {}
    for attribute, text in SPECIALS:
        token = config_values.get(attribute)
        if isinstance(token, list):
            token = token[0] if token else None
        if isinstance(token, int) and 0 <= token < vocab_size and token not in chosen:
            chosen[token] = text
    return chosen


def _learned(capacity: int) -> tuple[list[str], list[tuple[str, str]]]:
    """Byte tokens and merges, ``capacity`` tokens at most, learned from CORPUS."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    learner = Tokenizer(models.BPE())
    learner.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=capacity, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    learner.train_from_iterator(CORPUS.splitlines(keepends=True), trainer=trainer)
    state = json.loads(learner.to_str())["model"]
    tokens = [token for token, _ in sorted(state["vocab"].items(), key=lambda item: item[1])]
    merges: list[tuple[str, str]] = []
    for merge in state["merges"]:
        left, right = merge.split(" ", 1) if isinstance(merge, str) else merge
        merges.append((left, right))
    return tokens, merges


def build_tokenizer(vocab_size: int, specials: dict[int, str]) -> Any:
    """The ``tokenizers.Tokenizer`` (see the module docstring)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    free = [i for i in range(vocab_size) if i not in specials]
    tokens, merges = _learned(len(free))
    vocab = {text: i for i, text in specials.items()}
    reserved = [f"<|reserved_{n}|>" for n in range(len(free) - len(tokens))]
    for i, text in zip(free, tokens + reserved, strict=True):
        vocab[text] = i
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(text, special=True) for text in specials.values()])
    bos = next((i for i, text in specials.items() if text == "<s>"), None)
    if bos is not None:
        tokenizer.post_processor = processors.TemplateProcessing(
            single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]
        )
    return tokenizer


def tokenizer_config(specials: dict[int, str], max_length: int | None) -> dict[str, Any]:
    names = {"<s>": "bos_token", "</s>": "eos_token", "<pad>": "pad_token"}
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "clean_up_tokenization_spaces": False,
    }
    config.update({names[text]: text for text in specials.values()})
    if max_length:
        config["model_max_length"] = max_length
    return config


def write_tiny_tokenizer(directory: str | Path, config_values: dict[str, Any]) -> list[str]:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` for the config's
    vocabulary into ``directory``; the files written (none for a vocabulary
    under MIN_VOCAB, too small for a byte-level tokenizer)."""
    from autoport_cst.atomic import write_atomic

    vocab_size = config_values.get("vocab_size")
    if not isinstance(vocab_size, int) or vocab_size < MIN_VOCAB:
        return []
    specials = special_ids(config_values, vocab_size)
    tokenizer = build_tokenizer(vocab_size, specials)
    directory = Path(directory)
    write_atomic(directory / "tokenizer.json", tokenizer.to_str(pretty=True) + "\n")
    settings = tokenizer_config(specials, config_values.get("max_position_embeddings"))
    write_atomic(directory / "tokenizer_config.json", json.dumps(settings, indent=2, sort_keys=True) + "\n")
    return list(FILES)
