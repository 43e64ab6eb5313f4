"""The second bf16 baseline: transformers at the kernels' precision policy
(validate/kernel_precision.py). The policy's attention is the stand-in's;
it is consulted only when a port fails against eager bf16.

The GraniteSWA port's bf16 error is about eager bf16's own (R-ratios of
1.0 to 1.2 at its last norm and logits), so whether it passes the eager gate
(R < 1.2) depends on the weights: on the tiny checkpoint of seed 0 it failed
there (logits R 1.45) until the tiny vocabulary went from 512 to 511, which
redrew every weight; since then seeds 0 to 14 pass eager and 15, 17, 22 of
the first 24 fail it. So the checkpoint on which the policy baseline is
exercised is derived, not looked up: the first seed of the tiny GraniteSWA
whose port fails against eager bf16 (``EAGER_APART``, at most
``SEEDS_SEARCHED`` seeds). The port validates there against the policy,
while wrong attention (scale x 1.05, window one token wider) fails against
both, first at the attention."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from autoport_cst.validate import compare
from autoport_cst.validate.kernel_precision import kernel_precision_attention
from autoport_cst.validate.standin.prefill_attention import softmax_attention

ROOT = Path(__file__).resolve().parents[2]


class _Attention(torch.nn.Module):
    def __init__(self, heads: int) -> None:
        super().__init__()
        self.sinks = torch.nn.Parameter(torch.randn(heads))


def test_policy_attention_computes_as_the_standin_kernel() -> None:
    torch.manual_seed(0)
    q = torch.randn(1, 4, 6, 8).to(torch.bfloat16)
    k = torch.randn(1, 2, 6, 8).to(torch.bfloat16)
    v = torch.randn(1, 2, 6, 8).to(torch.bfloat16)
    visible = torch.ones(6, 6, dtype=torch.bool).tril()
    mask = torch.zeros(1, 1, 6, 6, dtype=torch.bfloat16).masked_fill(
        ~visible, torch.finfo(torch.bfloat16).min
    )
    module = _Attention(4)
    out, _ = kernel_precision_attention(module, q, k, v, mask, 0.7)
    expected = softmax_attention(
        q[0], k[0].repeat_interleave(2, 0), v[0].repeat_interleave(2, 0), 0.7, visible, module.sinks.detach()
    )
    assert torch.equal(out[0].transpose(0, 1), expected)
    eager_scores = (q.float() @ k.repeat_interleave(2, 1).float().transpose(2, 3)).to(torch.bfloat16)
    assert not torch.equal(
        eager_scores.float(), q.float() @ k.repeat_interleave(2, 1).float().transpose(2, 3)
    )


def _result(equivalent: bool, failed: list[str]) -> compare.Comparison:
    return compare.Comparison([], [], None, equivalent, None, failed)  # type: ignore[arg-type]


def test_the_policy_baseline_is_run_only_when_eager_fails(monkeypatch) -> None:
    eager_run, policy_run = object(), object()  # stand for the two transformers outputs
    outcomes = {"eager": _result(True, []), "policy": _result(True, [])}
    names = {id(eager_run): "eager", id(policy_run): "policy"}
    monkeypatch.setattr(compare, "compare_all", lambda port, f, b, *rest: outcomes[names[id(b)]])
    runs: list[str] = []

    def policy() -> object:
        runs.append("policy")
        return policy_run

    result, used = compare.compare_bf16_baselines(None, None, eager_run, policy, None, [])  # type: ignore[arg-type]
    assert result is outcomes["eager"] and used == {"used": "eager"} and not runs
    outcomes["eager"] = _result(False, ["logits (prefill): r_ratio"])
    result, used = compare.compare_bf16_baselines(None, None, eager_run, policy, None, [])  # type: ignore[arg-type]
    assert result is outcomes["policy"] and used["used"] == "kernel_precision"
    assert used["eager"] == {"failed_checks": ["logits (prefill): r_ratio"]}
    outcomes["policy"] = _result(False, ["layers.0.attention (prefill): r_ratio"])
    result, used = compare.compare_bf16_baselines(None, None, eager_run, policy, None, [])  # type: ignore[arg-type]
    assert result is outcomes["eager"] and used["used"] == "eager"
    assert used["kernel_precision"] == {"failed_checks": ["layers.0.attention (prefill): r_ratio"]}


SEEDS_SEARCHED = 64


@pytest.fixture(scope="module")
def granite_swa(tmp_path_factory) -> tuple[Path, Path, object]:
    """The GraniteSWA port, the first tiny checkpoint (by seed) whose bf16
    validation fails against eager bf16, and that validation's report."""
    work = tmp_path_factory.mktemp("granite-swa-policy")
    plan = ROOT / "examples" / "granite_swa.plan.json"
    cli = [
        sys.executable,
        "-m",
        "autoport_cst",
        "apply",
        "--plan",
        str(plan),
        "--out",
        str(work / "g"),
        "--force",
    ]
    subprocess.run(cli, check=True, capture_output=True)
    package = work / "g" / "vllm_neuron" / "model" / "granite_swa"
    return (package, *_eager_apart(package, work))


def _eager_apart(package: Path, work: Path) -> tuple[Path, object]:
    from autoport_cst.validate import build_tiny_checkpoint, validate_model

    for seed in range(SEEDS_SEARCHED):
        checkpoint = build_tiny_checkpoint("GraniteSWAForCausalLM", work / f"tg{seed}", seed=seed).directory
        report = validate_model(
            package, checkpoint, dtype="bf16", config_variants=False, parallel_layouts=False
        )
        if _eager_failed(report):
            return Path(checkpoint), report
        shutil.rmtree(checkpoint)
    pytest.fail(f"the GraniteSWA port passes eager bf16 on the tiny seeds 0 to {SEEDS_SEARCHED - 1}")


def _eager_failed(report) -> bool:
    """Whether the port failed against eager bf16 (the policy was consulted)."""
    baseline = report.bf16_baseline
    return baseline["used"] == "kernel_precision" or "kernel_precision" in baseline


@pytest.mark.slow
def test_granite_swa_validates_in_bf16_against_the_policy_baseline(granite_swa) -> None:
    _package, _checkpoint, report = granite_swa
    assert report.equivalent, report.failed_checks
    assert report.bf16_baseline["used"] == "kernel_precision"
    assert report.bf16_baseline["eager"]["failed_checks"], report.bf16_baseline
    assert "kernels' precision policy" in report.summary()


def _mutant(tmp_path: Path, package: Path, pattern: str, replacement: str, count: int) -> Path:
    target = tmp_path / "mutant"
    shutil.copytree(package, target, ignore=shutil.ignore_patterns("__pycache__"))
    model = target / "model.py"
    text, found = re.subn(pattern, replacement, model.read_text(encoding="utf-8"))
    assert found == count, pattern
    model.write_text(text, encoding="utf-8")
    return target


@pytest.mark.slow
@pytest.mark.parametrize(
    "pattern, replacement, count, component",
    [
        # the attention scale 5 % too large
        (
            r"config\.attention_multiplier if config\.attention_multiplier is not None",
            "config.attention_multiplier * 1.05 if config.attention_multiplier is not None",
            1,
            "layers.0.attention",
        ),
        # decode's sliding window one token wider
        (r"\((self\.sliding_window|window) - 1\)", r"\1", 2, "layers.1.attention"),
    ],
)
def test_wrong_attention_fails_against_both_baselines(
    tmp_path, granite_swa, pattern, replacement, count, component
) -> None:
    from autoport_cst.validate import validate_model

    package, checkpoint, _report = granite_swa
    report = validate_model(_mutant(tmp_path, package, pattern, replacement, count), checkpoint, dtype="bf16")
    assert not report.equivalent and report.exit_code == 1
    assert report.bf16_baseline["used"] == "eager"
    policy_failures = report.bf16_baseline["kernel_precision"]["failed_checks"]
    assert policy_failures[0].startswith(component), policy_failures


def test_a_model_without_the_policy_keeps_the_eager_verdict_and_says_why(monkeypatch) -> None:
    failed = _result(False, ["logits: three_way"])
    monkeypatch.setattr(compare, "compare_all", lambda *args: failed)
    result, used = compare.compare_bf16_baselines(None, None, None, lambda: "softcap", None, [])  # type: ignore[arg-type]
    assert result is failed and used == {"used": "eager", "kernel_precision": {"unavailable": "softcap"}}
