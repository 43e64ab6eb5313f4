"""Why the GraniteSWA port does not validate in bf16 on some prompts, checked
rather than asserted in prose.

The tiny checkpoint keeps transformers' default attention multiplier of 1.0
(four times ``head_dim ** -0.5``), so attention is sharply peaked and a
one-ulp difference in q or k can move a row's output a lot. The port rounds
in two places differently from transformers' eager bf16 code, both as the
device kernels do: its RMSNorm multiplies by the weight before rounding to
bf16 (transformers rounds first), and its attention keeps the scores, the
sink and the softmax in float32 (transformers computes the scores and the
sink's log-sum-exp in bf16).

The control is transformers' own modeling code with exactly those two
changes. Its per-component R-ratios against the eager bf16 run match the
port's on every prompt seed, including the seeds where the prefill attention
of layer 1 exceeds the 1.2 bound: the bound fails on transformers' own
computation done at that precision, not on something the port computes
differently. That control is now the validator's second bf16 baseline
(validate/kernel_precision.py): on those seeds the port validates against it.
The control's rows are the validator's (cache-path sequences included).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from autoport_cst.validate import build_tiny_checkpoint, validate_model
from autoport_cst.validate import metrics as M
from autoport_cst.validate.compare import _ref_rows
from autoport_cst.validate.reference import greedy_teacher, load_reference, run_reference
from autoport_cst.validate.scenario import Scenario, cache_paths_fit
from tests.validation_depth import FULL, OWN, port_at_depth, slow_run

pytest.importorskip("transformers")
granite_swa = pytest.importorskip("transformers.models.granite_swa.modeling_granite_swa")

STEPS = 16


def _attention_in_float32(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    dtype = query.dtype
    keys = granite_swa.repeat_kv(key, module.num_key_value_groups).float()
    values = granite_swa.repeat_kv(value, module.num_key_value_groups).float()
    scores = torch.matmul(query.float(), keys.transpose(2, 3)) * scaling
    if attention_mask is not None:
        scores = scores + attention_mask.float()
    sink = module.sinks.float().view(1, -1, 1, 1).expand(scores.shape[0], -1, scores.shape[2], 1)
    probs = F.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1].to(dtype)
    output = torch.matmul(probs.float(), values).to(dtype)
    return output.transpose(1, 2).contiguous(), probs


def _norm_weight_before_rounding(self, hidden_states):
    dtype = hidden_states.dtype
    x = hidden_states.to(torch.float32)
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
    return (self.weight * x).to(dtype)


def _control_r_ratios(checkpoint: Path, seed: int, prompt_lengths, block_size: int) -> dict[str, float]:
    model32 = load_reference(checkpoint, torch.float32)
    model16 = load_reference(checkpoint, torch.bfloat16)
    scenario = Scenario.build(
        model32.config.vocab_size, 1, STEPS, prompt_lengths, block_size, seed, cache_paths=cache_paths_fit(1)
    )
    teacher = greedy_teacher(model32, scenario.prompts, STEPS)
    fp32, bf16 = (run_reference(m, scenario.prompts, teacher) for m in (model32, model16))
    saved = granite_swa.eager_attention_forward, granite_swa.GraniteSWARMSNorm.forward
    granite_swa.eager_attention_forward = _attention_in_float32
    granite_swa.GraniteSWARMSNorm.forward = _norm_weight_before_rounding
    try:
        control = run_reference(model16, scenario.prompts, teacher)
    finally:
        granite_swa.eager_attention_forward, granite_swa.GraniteSWARMSNorm.forward = saved
    ratios = {}
    for name in control.records:
        for phase in ("prefill", "decode"):
            f, b, t = (_ref_rows(run.records[name], scenario, phase) for run in (fp32, bf16, control))
            ratios[f"{name} ({phase})"] = M.r_ratio(t, b, f)
    return ratios


@pytest.fixture(scope="module")
def ported(tmp_path_factory, request):
    """The port on its own runs: these tests are about its bf16 run, and the
    validation's follow-ups of a granite_swa port run in
    tests/codemods_attention/test_multipath_ports.py (all of them here with
    --run-slow: tests/validation_depth.py)."""
    work = tmp_path_factory.mktemp("granite-swa")
    build_tiny_checkpoint("GraniteSWAForCausalLM", work / "src", seed=0)
    depth = FULL if slow_run(request.config) else OWN
    return port_at_depth(depth, str(work / "src"), "port_granite_swa", work / "out", force=True, steps=STEPS)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_port_r_ratios_are_those_of_transformers_at_the_port_precision(ported, seed):
    assert ported.runs[0].dtype == "fp32" and ported.runs[0].equivalent  # the computation is right
    report = validate_model(ported.package_dir, ported.checkpoint_dir, dtype="bf16", steps=STEPS, seed=seed)
    if report.bf16_baseline["used"] == "kernel_precision":
        # the R-ratios below are against that baseline (validate/kernel_precision.py), this very control
        assert report.equivalent and report.bf16_baseline["eager"]["failed_checks"]
        return
    settings = report.settings
    control = _control_r_ratios(
        ported.checkpoint_dir, seed, tuple(settings["prompt_lengths"]), settings["block_size"]
    )
    components = [c for c in report.components if c["name"] != "logits"]
    assert len(components) == len(control) >= 20
    for c in components:
        key = f"{c['name']} ({c['phase']})"
        assert c["r_ratio"] == pytest.approx(control[key], abs=0.1), (key, c["r_ratio"], control[key])
    failing = [f"{c['name']} ({c['phase']})" for c in components if not c["passed"]]
    if failing:
        # transformers' own code at the port's precision fails the bound there too
        assert all(control[key] >= M.R_RATIO_TOLERANCE for key in failing), {k: control[k] for k in failing}
