"""The rank-less forward check (``validate.rankless_check``).

The references' causal LM declares ``rank: torch.Tensor | None = None`` and
gives None a meaning (the embedding, the LM head and the sampler use their
own group's rank); the shift of the embedding rank to the embedding TP group
applies ``if rank is not None and self.embedding_dp_size > 1``. The
validator always passes ``rank``, so the ``and`` turned into ``or`` (the
mutation benchmark's mixtral:1219, from this qwen3_moe line: ``None + int``
with embedding DP > 1) validated. Every run with embedding DP > 1 (the
default validation's ``embedding DP 2`` and ``DP 2 (MLP, embedding, LM
head)`` layouts) now repeats its last decode step with ``rank`` omitted and
asks for the logits of the call with ``rank``.

Fast: where the default is read from. Then the qwen3_moe reference and two
copies of it at both layouts (``validate_model``, their options taken from
``parallel_checks.LAYOUTS``): the reference validates, the ``or`` mutant
fails naming the check (the call raises), a copy whose rank-less
embedding takes shard 0 on every rank fails naming it (other logits), and
one raising on rank 1 only fails naming rank 1's error (rank 0 fails in the
collective rank 1 left). Last, the default validation of the ``or`` mutant
fails at the first layout that asks.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autoport_cst.validate.parallel_checks import LAYOUTS
from autoport_cst.validate.rankless_check import CHECK, _declares_in, declared_default
from tests.edited_copies import edited_copy

ROOT = Path(__file__).resolve().parents[2]
QWEN3_MOE = ROOT / "reference_models" / "qwen3_moe"
SHIFT = "        if rank is not None and self.embedding_dp_size > 1:\n"
MUTANT = SHIFT.replace(" and ", " or ")  # mixtral:1219
NONE_AS_ZERO = "        embedding_rank = rank\n"  # None: shard 0 on every rank, not the group's own
ZERO = "        embedding_rank = torch.tensor(0, dtype=torch.int32) if rank is None else rank\n"
RUN = dict(steps=3, prompt_lengths=(8, 12, 20))
# the default validation's layouts with embedding DP > 1: the runs that ask
ASKING = [label for label, options in LAYOUTS if options.get("embedding_dp", 1) > 1]

pytestmark = pytest.mark.usefixtures("shared_reference_runs")


def _declares(tmp_path: Path, signature: str, factory: bool = True) -> bool:
    path = tmp_path / "model.py"
    classmethod_ = (
        "    @classmethod\n    def from_configs(cls, c, n=None):\n        pass\n" if factory else ""
    )
    path.write_text(f"class M:\n{classmethod_}    def forward({signature}):\n        pass\n", "utf-8")
    return _declares_in(str(path), path.stat().st_mtime_ns)


def test_the_default_is_read_from_the_factory_class_forward(tmp_path):
    assert _declares(tmp_path, "self, input_ids, rank=None, **kwargs")
    assert _declares(tmp_path, "self, input_ids, *, rank: 'torch.Tensor | None' = None")
    assert not _declares(tmp_path, "self, input_ids, rank")  # rank required: None is no input
    assert not _declares(tmp_path, "self, input_ids, rank=0")
    assert not _declares(tmp_path, "self, input_ids, rank=None", factory=False)  # not the causal LM


def test_the_default_comes_from_the_reference_the_port_names(tmp_path):
    assert declared_default(QWEN3_MOE) == "reference qwen3_moe (model.py)"
    port = tmp_path / "port"
    port.mkdir()
    (port / "model.py").write_text(
        "class M:\n    def forward(self, input_ids, rank):\n        pass\n", "utf-8"
    )
    manifest = {"name": "somemodel", "provenance": {"reference": "qwen3_moe"}}
    (port / "reference.json").write_text(json.dumps(manifest), encoding="utf-8")
    assert declared_default(port) == "reference qwen3_moe (model.py)"  # a port that dropped it is asked
    (port / "reference.json").write_text(json.dumps({"name": "somemodel"}), encoding="utf-8")
    assert declared_default(port) is None  # its own code declares no default: not asked


@pytest.fixture(scope="module")
def tiny_qwen3_moe(tmp_path_factory) -> Path:
    from autoport_cst.validate.tiny import build_tiny_checkpoint

    directory = tmp_path_factory.mktemp("tiny-qwen3-moe-rankless")
    build_tiny_checkpoint("Qwen3MoeForCausalLM", directory, seed=0, keep_layer_kinds=True)
    return directory


def _copy(tmp_path: Path, old: str, new: str) -> Path:
    return edited_copy(QWEN3_MOE, tmp_path / "qwen3_moe", [(old, new)])


def _validated(port: Path, checkpoint: Path, label: str):
    from autoport_cst.validate import validate_model

    return validate_model(port, checkpoint, **dict(LAYOUTS)[label], **RUN)


def test_the_layouts_that_ask():
    assert ASKING == ["DP 2 (MLP, embedding, LM head)", "embedding DP 2"]


@pytest.mark.parametrize("label", ASKING)
def test_the_reference_gives_the_same_logits_without_rank(tiny_qwen3_moe, label):
    report = _validated(QWEN3_MOE, tiny_qwen3_moe, label)
    assert report.equivalent, report.summary()
    assert report.settings["rankless_check"] == [
        "decode step 2 again with rank omitted (embedding DP 2): the same logits as the call with rank given"
    ]
    assert report.timings["port_rankless_check_cpu"] < 1.0


@pytest.mark.parametrize("label", ASKING)
def test_the_or_mutant_fails_named(tmp_path, tiny_qwen3_moe, label):
    report = _validated(_copy(tmp_path, SHIFT, MUTANT), tiny_qwen3_moe, label)
    assert not report.equivalent
    # the runs with rank given are the reference's: only the new check fails
    (failed,) = report.failed_checks
    assert failed.startswith(
        f"{CHECK}: rank 0: decode step 2 again with rank omitted (embedding DP 2) raised:"
    )
    assert "TypeError: unsupported operand type(s) for +: 'NoneType' and 'int'" in failed
    assert report.failure is not None and report.failure.stage == CHECK and report.exit_code == 1


def test_other_logits_without_rank_fail_named(tmp_path, tiny_qwen3_moe):
    report = _validated(_copy(tmp_path, NONE_AS_ZERO, ZERO), tiny_qwen3_moe, "embedding DP 2")
    (failed,) = report.failed_checks
    assert failed.startswith(f"{CHECK}: rank 0: decode step 2 again with rank omitted (embedding DP 2)")
    assert "its logits differ from the call with rank given" in failed


def test_a_run_without_embedding_dp_does_not_ask(tiny_qwen3_moe):
    report = _validated(QWEN3_MOE, tiny_qwen3_moe, "attention DP 2")
    assert report.equivalent and "rankless_check" not in report.settings


def test_the_default_validation_of_the_or_mutant_fails_at_the_first_layout_that_asks(
    tmp_path, tiny_qwen3_moe
):
    from autoport_cst.validate import validate_model

    report = validate_model(_copy(tmp_path, SHIFT, MUTANT), tiny_qwen3_moe, **RUN)
    assert not report.equivalent and report.exit_code == 1
    (failed,) = report.failed_checks
    assert failed.startswith(f"{ASKING[0]}: {CHECK}: rank 0: decode step 2 again with rank omitted"), failed
    ran = {entry["label"]: entry["equivalent"] for entry in report.parallel_layouts}
    assert ran["TP=2"] and ran["attention DP 2"] and ran[ASKING[0]] is False


def test_a_call_raising_on_one_rank_only_fails_naming_its_error(tmp_path, tiny_qwen3_moe):
    raising = '        if rank is None and self.embedding_tp_rank == 1:\n            raise RuntimeError("rank 1 only")\n'
    report = _validated(_copy(tmp_path, SHIFT, raising + SHIFT), tiny_qwen3_moe, "embedding DP 2")
    (failed,) = report.failed_checks
    # rank 0 fails in the collective rank 1 left; rank 1's own error is named too
    assert failed.startswith(
        f"{CHECK}: rank 0: decode step 2 again with rank omitted (embedding DP 2) raised:"
    )
    assert (
        "; rank 1: decode step 2 again with rank omitted (embedding DP 2) raised: RuntimeError: rank 1 only"
        in failed
    )
