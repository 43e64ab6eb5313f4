"""Validate a vision-language port against transformers'
``...ForConditionalGeneration``, component by component, on CPU.

Per prompt (``vision_prompts``: one with two images, one text-only) the
report compares, in data-flow order: the M-RoPE positions of the prompt
against ``get_rope_index`` (exactly, with the delta of later positions);
the vision tower's blocks, deep-stack mergers and final merger; the text
decoder's components over the prefill and the teacher-forced decode steps;
the logits. A component passes as in the text validator
(``metrics.component_metrics``: relative Frobenius error at most 1e-5 in
float32, R-ratio under 1.2 against transformers' own bfloat16 error in
bfloat16). The first failing component is ``first_diverging``. A bf16 run at
TP > 1 that fails against transformers' eager bf16 is compared again with
its row-parallel projections summed as the ranks sum them
(``partial_sums``); ``bf16_baseline`` says which baseline was used.

A float32 run at TP > 1 that passes runs again with on-device sampling, as
the runner builds the port by default (``VisionPortSession``): the logits
each prompt returns beside its sampled tokens are checked
(``sampled_output``: the padded vocabulary's ids masked before the sampler,
the logits cut) and compared with transformers' (``logits (on-device
sampling)``). The tiny checkpoint's odd vocabulary is padded in the LM head
at TP=2, so that run is where a port that samples over the padding fails.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from autoport_cst.errors import InputError

from . import lint_gate
from .driver import PortFailure, port_hf_config
from .metrics import component_metrics
from .package import imported_package
from .standin import kernel_phases, standin_installed
from .vision_prompts import VisionPrompt, vision_prompts
from .vision_reference import VisionReferenceRun, bf16_runs, run_vision_reference
from .vision_session import VisionPortRun, VisionPortSession

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


@dataclass
class VisionValidationReport:
    """What a vision-language validation found (``equivalent`` when every
    check passed and the port ran)."""

    dtype: str
    steps: int
    tp: int = 1
    checks: list[dict[str, Any]] = field(default_factory=list)
    failure: str | None = None
    failure_stage: str | None = None
    kernel_calls: dict[str, dict[str, int]] = field(default_factory=dict)
    lint: list[dict[str, Any]] = field(default_factory=list)  # lint_gate's findings on the package
    # bf16: which transformers run the R-ratios are against (_against_rank_sums)
    bf16_baseline: dict[str, Any] = field(default_factory=lambda: {"used": "eager"})

    @property
    def equivalent(self) -> bool:
        return self.failure is None and bool(self.checks) and all(c["passed"] for c in self.checks)

    @property
    def first_diverging(self) -> str | None:
        return next(iter(_failed(self.checks)), None)

    def summary(self) -> str:
        """One line: the verdict, and where a failing run failed."""
        if self.equivalent:
            return "equivalent within tolerances (vision-language: tower, M-RoPE positions, decoder, logits)"
        if self.failure is not None and self.failure_stage == lint_gate.STAGE:  # not run
            return f"does not validate: {self.failure}"
        if self.failure is not None:
            return f"not equivalent: the port failed at {self.failure_stage}: {self.failure}"
        return f"not equivalent: first diverging check: {self.first_diverging}"

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "equivalent": self.equivalent, "first_diverging": self.first_diverging}


def _rope_check(label: str, port: VisionPortRun, reference: VisionReferenceRun) -> dict[str, Any]:
    expected = reference.rope_positions
    if expected is None:
        raise ValueError("the reference run has no M-RoPE positions (run_vision_reference sets them)")
    got = port.rope_positions
    if got is None:  # a text-only prompt: the port's positions are the token positions
        got = torch.arange(expected.shape[1]).view(1, -1).expand(3, -1)
    same = tuple(got.shape) == tuple(expected.shape) and bool(torch.equal(got.long(), expected.long()))
    note = None if same else f"port {got.tolist()} vs transformers {expected.tolist()}"
    if same and port.rope_delta != reference.rope_delta:
        same, note = False, f"delta: port {port.rope_delta} vs transformers {reference.rope_delta}"
    return {"prompt": label, "name": "mrope_positions", "phase": "host", "passed": same, "note": note}


def _component_checks(
    label: str, port: VisionPortRun, fp32: VisionReferenceRun, bf16: VisionReferenceRun | None, dtype: str
) -> list[dict[str, Any]]:
    checks = []
    names = list(fp32.records) + ["logits"]
    for name in names:
        target = port.logits if name == "logits" else port.records.get(name)
        expected = fp32.logits if name == "logits" else fp32.records[name]
        baseline = None if bf16 is None else (bf16.logits if name == "logits" else bf16.records.get(name))
        phase = "vision" if name.startswith("vision.") else "prefill+decode"
        if target is None:
            checks.append(
                {
                    "prompt": label,
                    "name": name,
                    "phase": phase,
                    "passed": False,
                    "note": "not recorded in the port",
                }
            )
            continue
        metrics = component_metrics(name, phase, name, target, expected, baseline, dtype)
        checks.append({"prompt": label, **asdict(metrics)})
    return checks


def _port_runs(
    package_dir: str | Path,
    checkpoint_dir: str | Path,
    dtype: str,
    prompts: tuple[VisionPrompt, ...],
    teachers: list[list[int]],
    tp: int,
    report: VisionValidationReport,
    on_device_sampling: bool = False,
) -> list[VisionPortRun]:
    """The port's run of each prompt, in process at TP=1, on ``tp`` ranks otherwise."""
    if tp > 1:
        from .vision_ranks import run_vision_ranks

        return run_vision_ranks(package_dir, checkpoint_dir, dtype, prompts, teachers, tp, on_device_sampling)
    from .standin.checkpoints import CheckpointError

    with standin_installed(), imported_package(package_dir) as package:
        try:
            hf_config = port_hf_config(checkpoint_dir, DTYPES[dtype])
            session = VisionPortSession(
                package.factory,
                checkpoint_dir,
                hf_config,
                len(prompts),
                on_device_sampling=on_device_sampling,
            )
            return session.run(prompts, teachers)
        except CheckpointError as error:  # transformers loaded it: the port's failure
            raise PortFailure(
                "load", f"the port cannot load a checkpoint transformers loads: {error}"
            ) from error
        finally:
            report.kernel_calls = kernel_phases.calls()


def validate_vlm(
    package_dir: str | Path,
    checkpoint_dir: str | Path,
    dtype: str = "fp32",
    steps: int = 4,
    seed: int = 0,
    tp: int = 1,
) -> VisionValidationReport:
    """Validate the port in ``package_dir`` on ``checkpoint_dir`` (module docstring)."""
    if dtype not in DTYPES:
        raise InputError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    hf_config = port_hf_config(checkpoint_dir, torch.float32)
    findings = lint_gate.lint_findings(package_dir)  # the hardware rules first (lint_gate)
    errors = lint_gate.failing(findings)
    if errors:
        message = lint_gate.failure_message(errors, package_dir)
        lint = [finding.to_dict() for finding in findings]
        return VisionValidationReport(
            dtype, steps, tp, failure=message, failure_stage=lint_gate.STAGE, lint=lint
        )
    prompts: tuple[VisionPrompt, ...] = vision_prompts(hf_config, seed)
    fp32, bf16 = run_vision_reference(checkpoint_dir, prompts, steps, bf16=dtype == "bf16")
    report = VisionValidationReport(dtype, steps, tp, lint=[finding.to_dict() for finding in findings])
    try:
        runs = _port_runs(package_dir, checkpoint_dir, dtype, prompts, [r.tokens for r in fp32], tp, report)
    except PortFailure as failure:
        report.failure, report.failure_stage = failure.message, failure.stage
        return report
    report.checks = _all_checks(prompts, runs, fp32, bf16, dtype)
    if bf16 is not None and tp > 1 and not report.equivalent:
        _against_rank_sums(report, checkpoint_dir, prompts, runs, fp32)
    if tp > 1 and dtype == "fp32" and report.equivalent:
        _sampling_checks(report, package_dir, checkpoint_dir, prompts, fp32, tp)
    return report


def _all_checks(
    prompts: tuple[VisionPrompt, ...],
    runs: list[VisionPortRun],
    fp32: list[VisionReferenceRun],
    bf16: list[VisionReferenceRun] | None,
    dtype: str,
) -> list[dict[str, Any]]:
    """Each prompt's M-RoPE check and component checks, in prompt order."""
    checks = []
    for index, (prompt, run) in enumerate(zip(prompts, runs, strict=True)):
        checks.append(_rope_check(prompt.label, run, fp32[index]))
        baseline = bf16[index] if bf16 is not None else None
        checks += _component_checks(prompt.label, run, fp32[index], baseline, dtype)
    return checks


def _against_rank_sums(
    report: VisionValidationReport,
    checkpoint_dir: str | Path,
    prompts: tuple[VisionPrompt, ...],
    runs: list[VisionPortRun],
    fp32: list[VisionReferenceRun],
) -> None:
    """A bf16 run at TP > 1 that fails against eager bf16, compared again
    with transformers' row-parallel projections summed as the ranks sum them
    (``partial_sums``), every gate unchanged: the port validates when it
    passes every check against that baseline; ``bf16_baseline`` says which
    baseline the checks reported are against, and the other's failures."""
    eager_failed = _failed(report.checks)
    summed = _all_checks(prompts, runs, fp32, bf16_runs(checkpoint_dir, prompts, fp32, report.tp), "bf16")
    summed_failed = _failed(summed)
    if not summed_failed:
        report.checks = summed
        report.bf16_baseline = {"used": "rank_partial_sums", "eager": {"failed_checks": eager_failed}}
        return
    report.bf16_baseline = {"used": "eager", "rank_partial_sums": {"failed_checks": summed_failed}}


def _failed(checks: list[dict[str, Any]]) -> list[str]:
    """``prompt:name`` of each failing check, in order."""
    return [f"{c['prompt']}:{c['name']}" for c in checks if not c["passed"]]


def _sampling_checks(
    report: VisionValidationReport,
    package_dir: str | Path,
    checkpoint_dir: str | Path,
    prompts: tuple[VisionPrompt, ...],
    fp32: list[VisionReferenceRun],
    tp: int,
) -> None:
    """The TP run again with on-device sampling (module docstring): each
    prompt's returned logits against transformers', or the port's failure."""
    teachers = [run.tokens for run in fp32]
    try:
        runs = _port_runs(package_dir, checkpoint_dir, "fp32", prompts, teachers, tp, report, True)
    except PortFailure as failure:
        report.failure = f"with on-device sampling at TP={tp}: {failure.message}"
        report.failure_stage = failure.stage
        return
    for prompt, run, reference in zip(prompts, runs, fp32, strict=True):
        metrics = component_metrics(
            "logits", "sampling", "logits", run.logits, reference.logits, None, "fp32"
        )
        report.checks.append(
            {"prompt": prompt.label, **asdict(metrics), "name": "logits (on-device sampling)"}
        )
