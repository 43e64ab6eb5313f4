"""A port that shards the vocabulary unpadded (as the real vllm_neuron llama3
and qwen3 do: ``self.lm_head = ColumnParallelLinear(config.hidden_size,
config.vocab_size, ...)``, the llama3's embedding loader given no
``pad_shard``) cannot build or load at a TP size the vocabulary does not
divide, on device as on the stand-in. Such a run is refused as bad input
(exit 2) before any rank process starts, naming the site; a default
validation reports the layouts it cannot take as not run. Every built-in
reference pads, and a port that turned a reference's padding off
(``pad_shard=False``) is not read as that shape: it still fails
(tests/validate/test_vocabulary_padding.py)."""

from __future__ import annotations

import time
from pathlib import Path

import libcst as cst
import pytest
from click.testing import CliRunner

from autoport_cst.cli import cli
from autoport_cst.errors import InputError
from autoport_cst.transform.anatomy.vocab_shards import takes_group, unpadded_shards
from autoport_cst.validate import build_tiny_checkpoint, validate_model
from autoport_cst.validate.vocab_shards import unpadded_site, vocabulary_refusal

ROOT = Path(__file__).resolve().parents[2]
# our llama3's LM head, and the real llama3's shape of it
PADDED_HEAD = "            config.hidden_size,\n            padded_vocab_size,\n"
UNPADDED_HEAD = "            config.hidden_size,\n            config.vocab_size,\n"

SOURCE = """
class LlamaForCausalLM(nn.Module):
    def __init__(self, config):
        group = get_neuron_lm_head_tp_group()
        self.lm_head = neuron_nn.ColumnParallelLinear(config.hidden_size, config.vocab_size, bias=False)
        emb_loader = sharding_weight_loader(
            shard_dim=0, shard_size=self.embed_tokens.vocab_size_per_rank, num_shards=self.embed_tokens.tp_size
        )
        padded = sharding_weight_loader(0, self.embed_tokens.vocab_size_per_rank, 2, False, True)
        flipped = sharding_weight_loader(0, self.embed_tokens.vocab_size_per_rank, 2, pad_shard=False)
        other = sharding_weight_loader(0, self.intermediate_size_per_rank, 2)
        self.head = ColumnParallelLinear(config.hidden_size, config.vocab_size)
        self.lm_head = ColumnParallelLinear(config.hidden_size, out_features=self.config.vocab_size)
        self.lm_head = ColumnParallelLinear(config.hidden_size, padded_vocab_size)
"""


def test_the_sites_that_shard_the_vocabulary_unpadded():
    module = cst.parse_module(SOURCE)
    found = [(s.component, s.line, s.column) for s in unpadded_shards(module)]
    # the LM head over config.vocab_size (positional and keyword), the embedding loader given no
    # pad_shard; not the padded or flipped loaders, another loader, another attribute, a padded head
    assert found == [("lm_head", 5, 9), ("embedding", 6, 22), ("lm_head", 13, 9)]
    assert takes_group(module, "lm_head") and not takes_group(module, "embedding")


def test_every_built_in_reference_pads():
    for package in sorted((ROOT / "reference_models").iterdir()):
        if (package / "model.py").is_file():
            assert unpadded_site(package) is None, package.name
            assert vocabulary_refusal(package, {"vocab_size": 511}, 2, {"lm_head": 2, "embedding": 2}) is None


@pytest.fixture(scope="module")
def unpadded_port(tmp_path_factory) -> Path:
    """Our llama3 with its LM head built over config.vocab_size."""
    import shutil

    target = tmp_path_factory.mktemp("unpadded") / "llama3"
    shutil.copytree(
        ROOT / "reference_models" / "llama3", target, ignore=shutil.ignore_patterns("__pycache__")
    )
    model = target / "model.py"
    text = model.read_text(encoding="utf-8")
    assert text.count(PADDED_HEAD) == 1
    model.write_text(text.replace(PADDED_HEAD, UNPADDED_HEAD), encoding="utf-8")
    return target


def _head_line(package: Path) -> int:
    text = (package / "model.py").read_text(encoding="utf-8")
    return text[: text.index(UNPADDED_HEAD)].count("\n")  # the line of `self.lm_head = ...(`


def test_a_tp_size_the_vocabulary_does_not_take_is_refused_naming_the_lm_head(unpadded_port, tiny_llama):
    started = time.process_time()
    with pytest.raises(InputError) as refused:
        validate_model(unpadded_port, tiny_llama, tp=2)
    assert time.process_time() - started < 10  # before the reference or any rank runs
    message = str(refused.value)
    line = _head_line(unpadded_port)
    assert (
        f"its LM head (model.py:{line}:9: ColumnParallelLinear over config.vocab_size, not padded) "
        in message
    )
    assert "the vocabulary of 511" in message and "over 2 ranks (TP 2)" in message
    # with LM-head DP the head takes its TP group: TP x LM-head DP ranks
    with pytest.raises(InputError, match=r"over 2 ranks \(TP 1 x LM-head DP 2\)"):
        validate_model(unpadded_port, tiny_llama, lm_head_dp=2, mlp_dp=2, embedding_dp=2)


def test_validate_exits_2(unpadded_port, tiny_llama):
    result = CliRunner().invoke(cli, ["validate", str(unpadded_port), "--hf", str(tiny_llama), "--tp", "2"])
    assert result.exit_code == 2, result.output
    assert "ColumnParallelLinear over config.vocab_size, not padded" in result.output


@pytest.mark.slow
def test_a_vocabulary_the_ranks_divide_validates_and_511_leaves_those_layouts_not_run(
    unpadded_port, tmp_path
):
    """512 ids: TP=2 validates (nothing to pad); 511: the default validation
    passes at TP=1 and names the layouts it could not run, not a failure."""
    even = build_tiny_checkpoint(
        "LlamaForCausalLM", tmp_path / "even", seed=0, dimensions={"vocab_size": 512}
    )
    report = validate_model(unpadded_port, even.directory, tp=2, steps=4, config_variants=False)
    assert report.equivalent, report.summary()
    odd = build_tiny_checkpoint("LlamaForCausalLM", tmp_path / "odd", seed=0)
    report = validate_model(unpadded_port, odd.directory, steps=4, config_variants=False)
    assert report.equivalent, report.summary()
    skipped = {
        e["label"] for e in report.parallel_layouts if "ColumnParallelLinear over config" in str(e["summary"])
    }
    assert {"TP=2", "DP 2 (MLP, embedding, LM head)", "on-device sampling at TP=2, LM-head DP 2"} <= skipped
    assert "embedding DP 2" not in skipped  # the embedding pads: that layout runs


def test_the_tp_sizes_of_a_reference_that_shards_the_vocabulary_unpadded():
    """plan's table with such a reference: a TP whose check padded the vocabulary is invalid (rule
    5), and the recommendation moves to a TP that divides it, or says none fits."""
    from autoport_cst.research.parallelism import ParallelDims, plan_parallelism, unpadded_vocabulary

    def plan(vocab: int, parameters: int):
        dims = ParallelDims(num_heads=32, num_kv_heads=8, intermediate_size=14336, vocab_size=vocab)
        return plan_parallelism(dims, parameters)

    named = "the reference real (its LM head (model.py:674:9))"
    # 8 * 10**9 parameters: 16 GB of bf16 weights, TP 2 is the smallest that fits
    padded = plan(128257, 8 * 10**9)
    assert padded.recommended_tp == 2 and all(c.valid for c in padded.checks if c.tp <= 4)
    adjusted = unpadded_vocabulary(padded, named)
    assert adjusted.recommended_tp is None
    assert adjusted.reason == f"no TP >= 2 is valid: {named} shards the vocabulary unpadded (rule 5)"
    two = next(c for c in adjusted.checks if c.tp == 2)
    assert (
        not two.valid
        and two.failures[-1] == f"rule 5: vocabulary 128257 not divisible by 2, which {named} shards unpadded"
    )
    assert not any("padded to" in note for c in adjusted.checks for note in c.notes)
    # 100002 ids: TP 2 divides them and does not fit (24 GB per rank), TP 4 fits (12 GB) and does not
    wide = plan(100002, 24 * 10**9)
    assert wide.recommended_tp == 4
    moved = unpadded_vocabulary(wide, named)
    assert moved.recommended_tp is None and moved.reason.startswith("no TP >= 2 fits: ")
    # a vocabulary every TP divides: nothing changes
    even = plan(128256, 8 * 10**9)
    assert unpadded_vocabulary(even, named) == even
