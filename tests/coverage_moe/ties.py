"""Telling a bf16 routing near-tie from a wrong port.

A router picks the top k experts, a discrete choice. Where the float32
reference's k-th and (k+1)-th expert scores differ by less than bf16 rounding
of the router input, the port's bf16 run and transformers' bf16 run may each
pick another expert than the float32 reference (see
``tests/moe/test_bf16_routing_ties.py``). Such a token's MoE output differs by
the order of the output itself, and one such token can fail a bf16 gate.

``bf16_failure_is_a_routing_tie`` checks that claim on a port whose bf16
validation failed, at the first diverging component: its worst token must be
a near tie of the float32 reference's expert choice (in that layer, or in any
MoE layer for a component after the last one), and when that component is an
MoE, the R-ratio without the near-tie tokens must keep the bf16 gate. (Later
components are not checked token by token: attention spreads a flipped
token's error to the tokens after it.) It does not change any gate: the
port's bf16 verdict stays "not equivalent"; the test only shows why.
"""

from __future__ import annotations

from pathlib import Path

import torch

from autoport_cst.validate import validate_model
from autoport_cst.validate.metrics import R_RATIO_TOLERANCE
from autoport_cst.validate.reference import greedy_teacher, load_reference, run_reference
from tests.moe.report_rows import aligned as _aligned
from tests.moe.report_rows import scenario_of

TIE_MARGIN = 1e-2  # gap between the k-th and (k+1)-th expert score (float32 reference)


def _router(block: torch.nn.Module, hidden: int):
    """The router weight [E, H] of a transformers MoE block, and a per-expert
    selection bias when the block has one."""
    weight, bias = None, None
    for name, tensor in [*block.named_parameters(), *block.named_buffers()]:
        if "experts" in name.split(".") or name.startswith("shared"):
            continue
        if (
            weight is None
            and tensor.dim() == 2
            and tensor.shape[1] == hidden
            and name.endswith("weight")
            and tensor.shape[0] < hidden
        ):
            weight = tensor
        if bias is None and "bias" in name.rsplit(".", 1)[-1] and tensor.numel() == tensor.shape[-1]:
            bias = tensor
    if bias is not None and weight is not None and bias.shape[-1] != weight.shape[0]:
        bias = None
    return weight, bias


def _margins(model, scenario, teacher, activation: str, top_k: int) -> dict[int, list[torch.Tensor]]:
    """layer -> per sequence, the float32 reference's top-k margin of each
    position ([positions, 1], in the layout of the reference's records)."""
    hidden = model.config.hidden_size
    inputs: dict[int, list[torch.Tensor]] = {}
    handles = []
    layers = {}
    for index, layer in enumerate(model.model.layers):
        block = next(
            (
                child
                for _, child in layer.named_children()
                if any("experts" in n.split(".") for n, _ in child.named_modules())
            ),
            None,
        )
        weight, bias = _router(block, hidden) if block is not None else (None, None)
        if weight is None:
            continue
        layers[index] = (weight, bias)
        inputs[index] = []
        handles.append(
            block.register_forward_pre_hook(
                lambda module, args, index=index: inputs[index].append(args[0].detach().reshape(-1, hidden))
            )
        )
    try:
        run_reference(model, scenario.prompts, teacher)
    finally:
        for handle in handles:
            handle.remove()
    found = {}
    for index, (weight, bias) in layers.items():
        rows = []
        for x in inputs[index]:
            logits = x.float() @ weight.detach().float().T
            scores = torch.softmax(logits, dim=-1) if activation == "softmax" else torch.sigmoid(logits)
            if bias is not None:
                scores = scores + bias.detach().float().reshape(-1)
            ordered = scores.sort(dim=-1, descending=True).values
            rows.append((ordered[:, top_k - 1] - ordered[:, top_k]).unsqueeze(-1))
        found[index] = rows
    return found


def _port_rows(output, component: str, phase: str) -> torch.Tensor:
    """The port's rows of ``component`` (or the logits) in the compared order."""
    if component == "logits":
        rows = output.prefill_logits if phase == "prefill" else output.decode_logits
    else:
        rows = (output.prefill_records if phase == "prefill" else output.decode_records)[component]
    return torch.cat(rows).double()


def _reference(output, component: str) -> list[torch.Tensor]:
    return output.logits if component == "logits" else output.records[component]


def bf16_failure_is_a_routing_tie(
    package_dir: Path, checkpoint: Path, steps: int, activation: str, top_k: int, tp: int = 1
) -> str:
    """Check that the bf16 failure of a port (on ``tp`` ranks) is explained
    by routing near-ties (raises AssertionError otherwise); returns what was
    found."""
    report = validate_model(package_dir, checkpoint, dtype="bf16", steps=steps, tp=tp)
    assert not report.equivalent
    scenario = scenario_of(report, checkpoint, steps)
    model32 = load_reference(checkpoint, torch.float32)
    teacher = greedy_teacher(model32, scenario.prompts, steps)
    margins = _margins(model32, scenario, teacher, activation, top_k)
    assert margins, "no MoE layer found in the transformers model"
    ref32 = run_reference(model32, scenario.prompts, teacher)
    ref16 = run_reference(load_reference(checkpoint, torch.bfloat16), scenario.prompts, teacher)
    first = report.first_diverging
    assert first is not None, report.summary()
    layer_of = {f"layers.{i}.mlp": i for i in margins}
    port_output = report.port_output
    phases = [first.phase] if first.phase in ("prefill", "decode") else ["prefill", "decode"]
    worst_phase, worst, worst_error, ties = None, -1, -1.0, None
    for phase in phases:
        port = _port_rows(port_output, first.component, phase)
        f = _aligned(_reference(ref32, first.component), first.component, scenario, phase, port_output)
        error = (port - f).double().norm(dim=-1)
        if float(error.max()) > worst_error:
            worst_phase, worst, worst_error = phase, int(error.argmax()), float(error.max())
    # near ties of the layers up to the failing one (all of them for a later component)
    upstream = [i for i in margins if first.component not in layer_of or i <= layer_of[first.component]]
    gaps = {
        i: _aligned(margins[i], first.component, scenario, worst_phase, port_output).reshape(-1)
        for i in upstream
    }
    ties = torch.zeros_like(gaps[upstream[0]], dtype=torch.bool)
    for i in upstream:
        ties |= gaps[i] < TIE_MARGIN
    assert bool(ties[worst]), (
        f"{first.component} ({worst_phase}): the worst token {worst} has clear expert choices "
        f"(smallest top-k margin {min(float(gaps[i][worst]) for i in upstream):.3g}); "
        f"{report.summary()}"
    )
    margin = min(float(gaps[i][worst]) for i in upstream)
    note = (
        f"{first.component} ({worst_phase}): worst token {worst} (top-k margin {margin:.2g}) is one of "
        f"{int(ties.sum())} near tie(s)"
    )
    if first.component in layer_of:
        port = _port_rows(port_output, first.component, worst_phase)
        f = _aligned(_reference(ref32, first.component), first.component, scenario, worst_phase, port_output)
        b = _aligned(_reference(ref16, first.component), first.component, scenario, worst_phase, port_output)
        kept = ~ties
        f, b = f.double(), b.double()
        r_ratio = ((port - f)[kept].norm() / ((b - f)[kept].norm() + 1e-12)).item()
        assert r_ratio < R_RATIO_TOLERANCE, (
            f"{first.component} ({worst_phase}): R-ratio {r_ratio:.3g} without the near-tie tokens; "
            f"{report.summary()}"
        )
        note += f"; R-ratio {r_ratio:.2f} without them"
    return note
