"""The sequence-parallel prefill-length check (``validate.sp_length_check``).

The references refuse, at the top of the causal LM's forward, a prefill
length the TP ranks cannot split (``T <= tp or T % tp != 0``: ValueError),
as vllm_neuron's models do. The validator never gives such a length, so a
port whose check was weakened (the ``or`` turned into ``and``: the mutation
benchmark's qwen3:833) or dropped validated at every default run. Every TP > 1
run now asks, on each rank after its run, for one prefill of each kind the
reference's check refuses, with the stand-in's collectives refusing to
communicate: the correct port refuses both with its own ValueError; the
weakened and the dropped check reach the embedding's reduce-scatter; a
refusal of another class fails too.

Fast: how the rule is read (from the reference the port names, not from the
port). Then the llama3 reference and three copies of it on two ranks
(``run_port_ranks``, one decode step, no transformers run), and the weakened
check through ``validate_model`` at TP=2: the report fails, naming the check.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autoport_cst.validate.sp_length_check import AT_MOST, CHECK, NOT_DIVISIBLE, _rule_in, declared_rule
from tests.edited_copies import edited_copy

ROOT = Path(__file__).resolve().parents[2]
LLAMA3 = ROOT / "reference_models" / "llama3"
CHECK_LINE = "        if is_prefill and (tokens <= self.world_size or tokens % self.world_size != 0):\n"
WEAKENED = CHECK_LINE.replace(" or ", " and ")
RAISE = '            raise ValueError(\n                f"prefill length {tokens} must exceed'

pytestmark = pytest.mark.usefixtures("shared_reference_runs")


def _module(tmp_path: Path, test: str, raised: str = "ValueError") -> tuple[tuple[str, ...], str] | None:
    path = tmp_path / "model.py"
    path.write_text(
        "class M:\n"
        "    def forward(self, input_ids, attn_metadata):\n"
        "        T = input_ids.shape[0]\n"
        f"        if {test}:\n"
        f"            raise {raised}('no')\n",
        encoding="utf-8",
    )
    return _rule_in(str(path), path.stat().st_mtime_ns)


def test_the_rule_is_read_as_its_test_computes(tmp_path):
    both = (AT_MOST, NOT_DIVISIBLE)
    assert _module(tmp_path, "is_prefill and (T <= self.world_size or T % self.world_size != 0)") == (
        both,
        "ValueError",
    )
    # vllm_neuron's own spelling (qwen3, llama3, qwen3_moe), another class
    assert _module(tmp_path, "p and ((T <= self.world_size) or (T % self.world_size != 0))", "E") == (
        both,
        "E",
    )
    # a conjunction of the two refuses neither kind (2 is divisible by 2; 3 exceeds 2)
    assert _module(tmp_path, "is_prefill and (T <= self.world_size and T % self.world_size != 0)") is None
    assert _module(tmp_path, "is_prefill and T % self.world_size != 0") == ((NOT_DIVISIBLE,), "ValueError")
    assert _module(tmp_path, "T > 4096") is None  # not a test against the TP size


def test_the_rule_comes_from_the_reference_the_port_names(tmp_path):
    rule = declared_rule(LLAMA3)
    assert rule is not None and rule.kinds == (AT_MOST, NOT_DIVISIBLE) and rule.error == "ValueError"
    assert rule.lengths(2) == [(AT_MOST, 2), (NOT_DIVISIBLE, 3)]
    # a port applied from llama3 that dropped the check is still asked (its provenance)
    port = tmp_path / "port"
    port.mkdir()
    (port / "model.py").write_text("class M:\n    def forward(self, input_ids):\n        pass\n", "utf-8")
    manifest = {"name": "somemodel", "provenance": {"reference": "llama3"}}
    (port / "reference.json").write_text(json.dumps(manifest), encoding="utf-8")
    assert declared_rule(port) == rule
    # without a reference, the port's own code: no check, not asked
    (port / "reference.json").write_text(json.dumps({"name": "somemodel"}), encoding="utf-8")
    assert declared_rule(port) is None


def _copy(tmp_path: Path, name: str, old: str, new: str) -> Path:
    return edited_copy(LLAMA3, tmp_path / name, [(old, new)])


def _asked(package: Path, checkpoint: Path) -> list[dict]:
    """The check's entries of a run on two ranks (one decode step, given teacher tokens)."""
    from autoport_cst.validate.distributed import merge_rank_outputs, run_port_ranks
    from autoport_cst.validate.scenario import Scenario

    vocabulary = json.loads((checkpoint / "config.json").read_text("utf-8"))["vocab_size"]
    scenario = Scenario.build(vocabulary, tp=2, steps=1, prompt_lengths=(4, 6))
    outputs, *_ = run_port_ranks(package, checkpoint, "fp32", scenario, 2, lambda: [[1], [2]])
    entries = merge_rank_outputs(outputs, scenario).length_check
    assert entries is not None
    return entries


COPIES = {
    "weakened": (CHECK_LINE, WEAKENED, "reached the reduce_scatter"),
    "dropped": (CHECK_LINE, "        if False:\n", "reached the reduce_scatter"),
    "another class": (RAISE, RAISE.replace("ValueError", "RuntimeError"), "was refused with RuntimeError"),
}


def test_the_reference_refuses_both_lengths_before_any_collective(tiny_llama):
    entries = _asked(LLAMA3, tiny_llama)
    assert [(e["length"], e["passed"]) for e in entries] == [(2, True), (3, True)]
    assert all("refused (ValueError: prefill length" in e["message"] for e in entries)


@pytest.mark.parametrize("name", list(COPIES))
def test_a_weakened_dropped_or_other_refusal_fails(tmp_path, tiny_llama, name):
    old, new, said = COPIES[name]
    (entry,) = _asked(_copy(tmp_path, name.replace(" ", "_"), old, new), tiny_llama)
    assert not entry["passed"]
    assert entry["message"].startswith("rank 0: a prefill of 2 tokens at TP=2 (at most the TP size)")
    assert said in entry["message"]
    if name == "another class":
        assert "the check of reference llama3 (model.py) raises ValueError" in entry["message"]


def test_the_weakened_check_fails_the_tp2_validation_named(tmp_path, tiny_llama):
    from autoport_cst.validate import validate_model

    report = validate_model(_copy(tmp_path, "weakened", CHECK_LINE, WEAKENED), tiny_llama, tp=2, steps=2)
    assert not report.equivalent and report.exit_code == 1
    assert report.failure is not None and report.failure.stage == CHECK and not report.failure.refusal
    assert report.failed_checks[-1].startswith(f"{CHECK}: rank 0: a prefill of 2 tokens")
    assert report.settings["prefill_length_check"] == [report.failure.message]
