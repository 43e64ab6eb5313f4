"""The llama3 reference validates against transformers' LlamaForCausalLM
(tiny checkpoint) through prefill and decode, at TP=1 and TP=2."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import torch

from autoport_cst.validate import REPORT_SCHEMA, validate_model
from autoport_cst.validate.metrics import FP32_REL_ERROR_TOLERANCE, R_RATIO_TOLERANCE
from tests.validation_depth import follow_up_options, slow_run

# The component names every decoder of the reference exposes, in order.
# validations on one checkpoint share its transformers run (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("shared_reference_runs")

EXPECTED_COMPONENTS = (
    ["embedding"]
    + [
        f"layers.{i}.{role}"
        for i in range(2)
        for role in ("input_norm", "attention", "post_attention_norm", "mlp", "output")
    ]
    + ["final_norm", "logits"]
)


@pytest.fixture(scope="module")
def fp32_report(llama3_dir: Path, tiny_llama: Path, request: pytest.FixtureRequest):
    # its follow-ups (config variants, FP8, parallel layouts) with --run-slow only: in the
    # default suite they run on the llama3 reference in tests/validate/test_cli.py's
    # test_tiny_then_validate_exit_0_with_json (its JSON report checked against the schema)
    # and on the port of a tiny Llama in tests/port/test_port_cli.py
    follow_ups = follow_up_options(slow_run(request.config))
    return validate_model(llama3_dir, tiny_llama, dtype="fp32", steps=8, **follow_ups)


def _components(report) -> dict[tuple[str, str], dict]:
    return {(c["name"], c["phase"]): c for c in report.components}


def _prefill_tokens(report) -> int:
    return sum(end - start for start, end in (call["positions"] for call in report.settings["prefill_calls"]))


def test_fp32_equivalent_through_prefill_and_decode(fp32_report) -> None:
    report = fp32_report
    assert report.equivalent, report.summary()
    assert report.exit_code == 0 and report.failure is None and report.first_diverging is None
    components = _components(report)
    for name in EXPECTED_COMPONENTS:
        for phase in ("prefill", "decode"):
            row = components[(name, phase)]
            assert row["rel_error"] <= FP32_REL_ERROR_TOLERANCE, (name, phase, row)
            assert row["rows"] > 0
    # prefill: every computed position; its logits: the sampled ones; decode: batch x steps
    calls = report.settings["prefill_calls"]
    batch = len({call["sequence"] for call in calls})
    sampled = sum(len(call["sampled_positions"]) for call in calls)
    assert components[("layers.0.output", "prefill")]["rows"] == _prefill_tokens(report)
    assert components[("logits", "prefill")]["rows"] == sampled
    assert components[("logits", "decode")]["rows"] == batch * 8
    logits = report.logits
    assert logits["tokens_passed"] == logits["tokens"] == sampled + batch * 8
    assert logits["top1_agreement"] == 1.0 and logits["greedy_match"] == 1.0
    assert logits["cosine_min"] > 0.999999
    assert report.not_compared == []


def test_report_json_follows_the_published_schema(fp32_report, tmp_path: Path) -> None:
    data = json.loads(fp32_report.to_json())
    jsonschema.validate(data, REPORT_SCHEMA)
    assert data["version"] == 1 and data["kind"] == "autoport-cst/validation-report"
    assert data["environment"]["stand_in"]["stand_in_packages"] == [
        "libtorch_neuronx_lite",
        "nki",
        "nkilib",
        "vllm",
        "vllm_neuron",
    ]


def test_bf16_equivalent_with_r_ratio(llama3_dir: Path, tiny_llama: Path) -> None:
    report = validate_model(llama3_dir, tiny_llama, dtype="bf16", steps=8)
    assert report.equivalent, report.summary()
    for row in report.components:
        assert row["gate"] == "r_ratio" and row["r_ratio"] < R_RATIO_TOLERANCE, row
    assert report.logits["gates"]["three_way"] and report.logits["gates"]["logit_validation"]


def test_tp2_gives_the_same_verdict_and_logits(fp32_report, llama3_dir: Path, tiny_llama: Path) -> None:
    tp2 = validate_model(llama3_dir, tiny_llama, dtype="fp32", steps=8, tp=2)
    assert tp2.equivalent == fp32_report.equivalent is True, tp2.summary()
    one, two = fp32_report.port_output, tp2.port_output
    for a, b in zip(
        one.prefill_logits + one.decode_logits, two.prefill_logits + two.decode_logits, strict=False
    ):
        assert a.shape == b.shape
        relative = float(torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(a))
        assert relative < FP32_REL_ERROR_TOLERANCE
    # the prefill outputs were sequence-parallel slices on each rank
    whole = [call.tokens for call in two.prefill_calls]
    assert [t.shape[0] for t in two.prefill_records["layers.0.attention"]] == whole


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("tp", [1, 2])
def test_exhaustive_seeds_dtypes_and_tp(
    tmp_path: Path, llama3_dir: Path, seed: int, dtype: str, tp: int
) -> None:
    from autoport_cst.validate.tiny import build_tiny_checkpoint

    checkpoint = build_tiny_checkpoint("LlamaForCausalLM", tmp_path / "ckpt", seed=seed).directory
    report = validate_model(llama3_dir, checkpoint, dtype=dtype, tp=tp, steps=16, seed=seed)
    assert report.equivalent, report.summary()
