"""A passing TP=1 fp32 validation goes on, by default, to TP=2 and to data
parallelism 2 of each component (validate.parallel_checks): parallel code
that a TP=1 run executes with identity values (rank 0 of one rank, DP groups
of one) is judged too."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from autoport_cst.errors import InputError
from autoport_cst.validate import validate_model
from autoport_cst.validate.dcp_layouts import DCP_LAYOUTS
from autoport_cst.validate.parallel_checks import (
    LAYOUTS,
    MOE_LAYOUTS,
    REPLICATED_KV,
    check_parallel_layouts,
)
from autoport_cst.validate.report import REPORT_SCHEMA, ValidationReport

ATTENTION_DP, OTHER_DP, EMBEDDING_DP, TWO_TOKENS, EMBEDS, EMBEDS_TP2, TP2_MLP_DP2, SAMPLING = (
    label for label, _ in LAYOUTS[1:]
)


def _run(port: Path, checkpoint: Path, **options) -> ValidationReport:
    return validate_model(port, checkpoint, steps=2, config_variants=False, **options)


def test_a_correct_port_validates_at_every_default_layout(llama3_dir: Path, tiny_llama: Path) -> None:
    report = _run(llama3_dir, tiny_llama)
    assert report.equivalent, report.summary()
    assert [(e["label"], e["equivalent"]) for e in report.parallel_layouts] == [
        ("TP=2", True),
        (ATTENTION_DP, True),
        (OTHER_DP, True),
        (EMBEDDING_DP, True),
        (TWO_TOKENS, True),
        (EMBEDS, True),
        (EMBEDS_TP2, True),
        (TP2_MLP_DP2, True),
        (SAMPLING, True),
        (REPLICATED_KV[0], True),
        *((label, True) for label, _, _ in DCP_LAYOUTS),  # llama3 takes DCP, prefill too
    ]
    assert "parallel_layouts" in report.timings
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate(report.to_dict(), REPORT_SCHEMA)


def test_sequence_parallel_slices_not_gathered_fail_at_tp2(
    broken_port, llama3_dir: Path, tiny_llama: Path
) -> None:
    # the prefill's SP slices are gathered for the LM head only from TP=3 on
    port = broken_port(
        "if is_prefill and self.world_size > 1:\n            hidden_states = self.tp_group.all_gather(hidden_states, dim=0)\n"
        "            aux_hidden_states",
        "if is_prefill and self.world_size > 2:\n            hidden_states = self.tp_group.all_gather(hidden_states, dim=0)\n"
        "            aux_hidden_states",
    )
    assert _run(port, tiny_llama, parallel_layouts=False).equivalent  # TP=1 cannot tell
    report = _run(port, tiny_llama)
    assert not report.equivalent
    assert report.parallel_layouts[0]["label"] == "TP=2"
    assert report.parallel_layouts[0]["equivalent"] is False
    assert len(report.parallel_layouts) == 1  # the first failure ends the checks
    named = report.failure.stage if report.failure is not None else report.first_diverging.message
    assert named.startswith("TP=2: "), report.summary()
    assert all(check.startswith("TP=2: ") for check in report.failed_checks)
    assert report.exit_code == 1


def test_each_mlp_dp_replica_keeping_the_first_rows_fails_at_dp2(broken_port, tiny_llama: Path) -> None:
    port = broken_port(
        "first_row = self.mlp_dp_group.rank_in_group * rows",
        "first_row = 0 * rows",
    )
    assert _run(port, tiny_llama, parallel_layouts=False).equivalent
    report = _run(port, tiny_llama)
    assert not report.equivalent
    assert [(e["label"], e["equivalent"]) for e in report.parallel_layouts] == [
        ("TP=2", True),
        (ATTENTION_DP, True),
        (OTHER_DP, False),
    ]
    assert report.summary().startswith(f"not equivalent: {OTHER_DP}: "), report.summary()


def test_a_decode_batch_left_in_the_embedding_dp_state_fails_at_embedding_dp2(
    broken_port, tiny_llama: Path
) -> None:
    # with every component at DP 2 the embedding's and the MLP's groups are the same
    port = broken_port(
        "            hidden_states = _dp_transition(hidden_states, self.embedding_dp_group, self.mlp_dp_group)",
        "            pass",
    )
    report = _run(port, tiny_llama)
    assert not report.equivalent
    assert [(e["label"], e["equivalent"]) for e in report.parallel_layouts] == [
        ("TP=2", True),
        (ATTENTION_DP, True),
        (OTHER_DP, True),
        (EMBEDDING_DP, False),
    ]
    named = report.failure.stage if report.failure is not None else report.first_diverging.message
    assert named.startswith(f"{EMBEDDING_DP}: "), report.summary()


def test_other_settings_and_opting_out_run_no_layout(llama3_dir: Path, tiny_llama: Path) -> None:
    assert _run(llama3_dir, tiny_llama, parallel_layouts=False).parallel_layouts == []
    assert _run(llama3_dir, tiny_llama, tp=2).parallel_layouts == []


def test_a_layout_the_checkpoint_cannot_take_is_reported_not_run() -> None:
    report = SimpleNamespace(parallel_layouts=[], equivalent=True)
    passing = SimpleNamespace(equivalent=True, failure=None, summary=lambda: "equivalent within tolerances")

    def validate(tp: int = 1, **_dp: int):
        if tp == 2:
            raise InputError("--tp 2: TP 2 breaks the tensor-parallel rules\n(more)")
        return passing

    check_parallel_layouts(report, validate)
    assert report.equivalent
    assert report.parallel_layouts == [
        {
            "label": "TP=2",
            "equivalent": None,
            "summary": "not run: --tp 2: TP 2 breaks the tensor-parallel rules",
        },
        {"label": ATTENTION_DP, "equivalent": True, "summary": "equivalent within tolerances"},
        {"label": OTHER_DP, "equivalent": True, "summary": "equivalent within tolerances"},
        {"label": EMBEDDING_DP, "equivalent": True, "summary": "equivalent within tolerances"},
        {"label": TWO_TOKENS, "equivalent": True, "summary": "equivalent within tolerances"},
        {"label": EMBEDS, "equivalent": True, "summary": "equivalent within tolerances"},
        {
            "label": EMBEDS_TP2,
            "equivalent": None,
            "summary": "not run: --tp 2: TP 2 breaks the tensor-parallel rules",
        },
        {
            "label": TP2_MLP_DP2,
            "equivalent": None,
            "summary": "not run: --tp 2: TP 2 breaks the tensor-parallel rules",
        },
        {
            "label": SAMPLING,
            "equivalent": None,
            "summary": "not run: --tp 2: TP 2 breaks the tensor-parallel rules",
        },
    ]


def test_expert_parallelism_runs_for_a_checkpoint_with_experts_only() -> None:
    passing = SimpleNamespace(equivalent=True, failure=None, summary=lambda: "equivalent within tolerances")
    seen: list[dict] = []

    def validate(**options):
        seen.append(options)
        return passing

    dense = SimpleNamespace(parallel_layouts=[], equivalent=True)
    check_parallel_layouts(dense, validate)
    assert [e["label"] for e in dense.parallel_layouts] == [label for label, _ in LAYOUTS]
    assert all("ep" not in options for options in seen)
    moe = SimpleNamespace(parallel_layouts=[], equivalent=True)
    check_parallel_layouts(moe, validate, experts=4)
    assert [e["label"] for e in moe.parallel_layouts] == [label for label, _ in LAYOUTS + MOE_LAYOUTS]
    assert seen[-1] == {"tp": 2, "ep": 2}
