"""A vocabulary the TP size does not divide: the default tiny checkpoint's is
odd, so the default TP=2 run shards a padded vocabulary. The qwen2 port from
examples/ (llama3's embedding and LM head: last shards zero-padded, padded
logits dropped) validates; copies whose embedding or LM-head loader does not
pad its last shard (``pad_shard=False``: the mutation benchmark's qwen2:993
is the embedding's) fail the default validation at TP=2."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from autoport_cst.cli import cli
from autoport_cst.validate import build_tiny_checkpoint, validate_model
from autoport_cst.validate.standin import collectives
from autoport_cst.validate.standin.layers import ColumnParallelLinear

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def qwen2_package(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("qwen2-port")
    result = CliRunner().invoke(
        cli, ["apply", "--plan", str(ROOT / "examples" / "qwen2.plan.json"), "--out", str(out), "-q"]
    )
    assert result.exit_code == 0, result.output
    return out / "vllm_neuron" / "model" / "qwen2"


@pytest.fixture(scope="module")
def tiny_qwen2(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("tiny-qwen2")
    build_tiny_checkpoint("Qwen2ForCausalLM", directory, seed=0)
    return directory


def _unpadded(tmp_path: Path, package: Path, anchor: str) -> Path:
    """A copy of ``package`` whose loader after ``anchor`` (its first
    ``pad_shard=True``) does not pad."""
    target = tmp_path / "mutant"
    shutil.copytree(package, target, ignore=shutil.ignore_patterns("__pycache__"))
    model = target / "model.py"
    text = model.read_text(encoding="utf-8")
    at = text.index(anchor)
    flag = text.index("pad_shard=True", at)
    assert flag - at < 400, "the pad_shard=True of that loader"
    model.write_text(text[:flag] + "pad_shard=False" + text[flag + len("pad_shard=True") :], encoding="utf-8")
    return target


def test_the_default_tiny_vocabulary_is_not_divided_by_two(
    tiny_qwen2: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The default TP=2 run gets a vocabulary ColumnParallelLinear refuses
    unpadded (as vllm_neuron's asserts ``out_features % tp_size == 0``)."""
    vocab = json.loads((tiny_qwen2 / "config.json").read_text())["vocab_size"]
    assert vocab % 2 == 1
    monkeypatch.setattr(collectives, "group_size", lambda group: 2)
    monkeypatch.setattr(collectives, "group_rank", lambda group: 0)
    with pytest.raises(ValueError, match="not divisible by the TP size 2"):
        ColumnParallelLinear(8, vocab, tp_group=object())
    assert ColumnParallelLinear(8, vocab + 1, tp_group=object()).out_features_per_rank == (vocab + 1) // 2


def test_the_port_validates_with_a_padded_vocabulary(qwen2_package: Path, tiny_qwen2: Path) -> None:
    report = validate_model(qwen2_package, tiny_qwen2)
    assert report.equivalent, report.summary()
    tp2 = [entry for entry in report.parallel_layouts if entry["label"] == "TP=2"]
    assert tp2 and tp2[0]["equivalent"], report.parallel_layouts


@pytest.mark.parametrize(
    "anchor",
    [
        "self.embed_tokens.vocab_size_per_rank",  # qwen2:993 of the mutation benchmark
        "self.lm_head.out_features_per_rank",
    ],
)
def test_a_loader_that_does_not_pad_fails_at_tp2(
    tmp_path: Path, qwen2_package: Path, tiny_qwen2: Path, anchor: str
) -> None:
    report = validate_model(_unpadded(tmp_path, qwen2_package, anchor), tiny_qwen2)
    assert not report.equivalent and report.exit_code == 1
    failed = [entry for entry in report.parallel_layouts if entry["equivalent"] is False]
    assert [entry["label"] for entry in failed] == ["TP=2"], report.parallel_layouts


@pytest.mark.slow
def test_a_tiny_gpt2_ports_and_validates_at_tp2(tmp_path: Path) -> None:
    """GPT-2's 50257 tokens, shrunk to the odd tiny vocabulary, with the LM
    head tied to the embedding: ported (from starcoder2), it validates at TP=2."""
    source = tmp_path / "gpt2"
    build_tiny_checkpoint("GPT2LMHeadModel", source, seed=0)
    assert json.loads((source / "config.json").read_text())["vocab_size"] % 2 == 1
    outcome = tmp_path / "outcome.json"
    result = CliRunner().invoke(
        cli, ["port", str(source), "--out", str(tmp_path / "out"), "--tp", "2", "--json", str(outcome)]
    )
    assert result.exit_code == 0, result.output
    runs = json.loads(outcome.read_text())["runs"]
    assert any(run["tp"] == 2 and run["equivalent"] for run in runs), runs
