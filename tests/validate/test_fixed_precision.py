"""A float32 run of a port whose own kernel call computes in bf16
(``validate.fixed_precision``).

The real vllm_neuron qwen3_moe passes ``compute_dtype=nl.bfloat16`` to
``NF.moe_cte``: its prefill experts compute in bf16 whatever the model's
dtype, on the device as in the stand-in, so its fp32 runs failed at the
first MoE layer (rel_error about 5e-3) however right the port. Here the
qwen3_moe reference is given that argument: its fp32 run is judged by the
bf16 gates from that component on and says so, naming the kernel and the
call; the same port with an expert wrong still fails, by the bf16 gates;
and a run with no such call is never judged that way.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from autoport_cst.validate import validate_model
from tests.edited_copies import edited_copy

ROOT = Path(__file__).resolve().parents[2]
QWEN3_MOE = ROOT / "reference_models" / "qwen3_moe"
OWN = "            compute_dtype=self.compute_dtype,\n"
BF16 = "            compute_dtype=nl.bfloat16,\n"
RUN = dict(dtype="fp32", steps=3, config_variants=False, parallel_layouts=False)

pytestmark = pytest.mark.usefixtures("shared_reference_runs")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from autoport_cst.validate.tiny import build_tiny_checkpoint

    directory = tmp_path_factory.mktemp("tiny-qwen3-moe")
    build_tiny_checkpoint("Qwen3MoeForCausalLM", directory, seed=0, keep_layer_kinds=True)
    return directory


def _port(tmp_path: Path, *edits: tuple[str, str]) -> Path:
    assert (QWEN3_MOE / "model.py").read_text(encoding="utf-8").count(OWN) == 1
    return edited_copy(QWEN3_MOE, tmp_path / "port", list(edits))


def test_bf16_experts_by_the_ports_own_call_are_held_to_the_bf16_gates(tmp_path, checkpoint):
    report = validate_model(_port(tmp_path, (OWN, BF16)), checkpoint, **RUN)
    assert report.equivalent, report.summary()
    precision = report.precision
    assert precision is not None and precision["bf16_gates"]["equivalent"]
    [call] = precision["narrowed"]
    assert call["kernel"] == "NF.moe_cte" and (call["compute"], call["given"]) == ("bfloat16", "float32")
    assert call["site"].startswith("model.py:")
    # what fp32 found stays in the report: the first MoE layer, at bf16's size of error
    assert "mlp" in precision["fp32"]["first_diverging"]
    assert "within the bf16 gates, not float32's" in report.summary()
    assert "NF.moe_cte in bfloat16" in report.summary()


def test_a_wrong_expert_still_fails_by_the_bf16_gates(tmp_path, checkpoint):
    wrong = (
        "            activation_function=ActFnType.SiLU,\n",
        "            activation_function=ActFnType.GELU,\n",
    )
    report = validate_model(_port(tmp_path, (OWN, BF16), wrong), checkpoint, **RUN)
    assert not report.equivalent
    assert report.precision is not None and report.precision["bf16_gates"]["equivalent"] is False
    assert report.first_diverging is not None and "mlp" in report.first_diverging.component


def test_a_failing_run_with_no_narrowed_call_is_not_judged_by_the_bf16_gates(tmp_path, checkpoint):
    wrong = (
        "            activation_function=ActFnType.SiLU,\n",
        "            activation_function=ActFnType.GELU,\n",
    )
    report = validate_model(_port(tmp_path, wrong), checkpoint, **RUN)
    assert not report.equivalent
    assert report.precision is None
    assert report.port_output.narrowed == []
