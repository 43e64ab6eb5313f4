"""Why some bf16 validations of MoE ports fail: expert choices on near-ties.

A router picks the top k experts: a discrete choice. When two experts' scores
differ by less than the bf16 rounding of the router's input, the port and
transformers' bf16 run may each pick either, and a token that goes to another
expert than the float32 reference's has an MoE output error of the order of
the output itself. The per-component R-ratio of bf16 validation then fails on
that one token, however close the port is everywhere else.

With the default tiny checkpoints (seed 0) and the 8 decode steps of
``test_ports.py`` every port validates in bf16. Elsewhere some do not
(measured with 16 decode steps: dots1 seed 0 at its 16th decode step,
qwen3_moe seed 1, mixtral seed 2, qwen2_moe seed 1, dots1 seeds 1 and 4;
float32 validates on every one of them). The two examined token by token,
dots1 seed 0 and qwen3_moe seed 1, each fail at a single token whose float32
top-k margin is 5e-3 and 2e-3. This slow test checks that claim on such a checkpoint: the first
failing component is an MoE, the worst token there has a float32 top-k
margin below ``TIE_MARGIN``, and the R-ratio without the near-tie tokens is
within the gate. It does not change the gate: the validation verdict stays
"not equivalent".
"""

from __future__ import annotations

import pytest
import torch

from autoport_cst.validate import build_tiny_checkpoint, validate_model
from autoport_cst.validate.compare import _ref_rows
from autoport_cst.validate.metrics import R_RATIO_TOLERANCE
from autoport_cst.validate.reference import greedy_teacher, load_reference, run_reference
from autoport_cst.validate.scenario import DEFAULT_BLOCK_SIZE, Scenario

from .conftest import QWEN3_MOE

TIE_MARGIN = 1e-2  # gap between the k-th and (k+1)-th softmax score
STEPS = 16


def _choice_margins(checkpoint, scenario, teacher, layer: int, phase: str) -> torch.Tensor:
    """Per compared row: the float32 reference's gap between the k-th and the
    (k+1)-th expert score of layer ``layer``'s router."""
    model = load_reference(checkpoint, torch.float32)
    router = model.model.layers[layer].mlp.gate
    top_k = model.config.num_experts_per_tok
    inputs: list[torch.Tensor] = []
    handle = router.register_forward_hook(
        lambda m, args, out: inputs.append(args[0].detach().reshape(-1, args[0].shape[-1]))
    )
    try:
        run_reference(model, scenario.prompts, teacher)
    finally:
        handle.remove()
    margins = []
    for x in inputs:
        scores = (
            torch.softmax(x.float() @ router.weight.float().T, dim=-1).sort(dim=-1, descending=True).values
        )
        margins.append((scores[:, top_k - 1] - scores[:, top_k]).unsqueeze(-1))
    return _ref_rows(margins, scenario, phase).reshape(-1)


@pytest.mark.slow
def test_a_failing_bf16_validation_is_a_routing_tie(tmp_path_factory):
    checkpoint = tmp_path_factory.mktemp("tiny-qwen3-moe-seed1")
    build_tiny_checkpoint("Qwen3MoeForCausalLM", checkpoint, seed=1, keep_layer_kinds=True)
    report = validate_model(QWEN3_MOE, checkpoint, dtype="bf16", steps=STEPS)
    fp32 = validate_model(QWEN3_MOE, checkpoint, dtype="fp32", steps=STEPS)
    assert fp32.equivalent, fp32.summary()
    if report.equivalent:
        pytest.skip("this checkpoint has no near-tie expert choice any more")
    first = report.first_diverging
    assert first.component.endswith(".mlp"), report.summary()
    layer = int(first.component.split(".")[1])

    scenario = Scenario.build(512, 1, STEPS, None, DEFAULT_BLOCK_SIZE, 0)
    reference32 = load_reference(checkpoint, torch.float32)
    teacher = greedy_teacher(reference32, scenario.prompts, STEPS)
    ref32 = run_reference(reference32, scenario.prompts, teacher)
    ref16 = run_reference(load_reference(checkpoint, torch.bfloat16), scenario.prompts, teacher)
    records = (
        report.port_output.prefill_records if first.phase == "prefill" else report.port_output.decode_records
    )
    port = torch.cat(records[first.component]).double()
    f = _ref_rows(ref32.records[first.component], scenario, first.phase).double()
    b = _ref_rows(ref16.records[first.component], scenario, first.phase).double()
    margins = _choice_margins(checkpoint, scenario, teacher, layer, first.phase)

    port_error = (port - f).norm(dim=-1)
    worst = int(port_error.argmax())
    assert margins[worst] < TIE_MARGIN, f"worst token {worst} has a clear top-k margin {margins[worst]:.3g}"
    ties = margins < TIE_MARGIN
    assert int(ties.sum()) <= 3
    kept = ~ties
    r_ratio = (port_error[kept].norm() / (b - f).norm(dim=-1)[kept].norm()).item()
    assert r_ratio < R_RATIO_TOLERANCE, f"R-ratio without the near-tie tokens: {r_ratio:.3g}"
