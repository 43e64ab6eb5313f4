"""Validate a model package against transformers on the same checkpoint.

``validate_model(model_dir, checkpoint_dir, tp=1, dtype="fp32", steps=16,
ep=1)`` returns a ``ValidationReport`` (``report.equivalent``, ``report.exit_code``,
``report.first_diverging``, ``report.to_json()``). Bad input (paths, options,
a TP size the tensor-parallel rules refuse, a truncated safetensors file, a
checkpoint that lacks a tensor or has one of the wrong shape) raises
``autoport_cst.errors.InputError`` before any rank process starts; a port
that crashes, breaks a hardware rule or cannot load a checkpoint that
transformers loads gives a report that is not equivalent and says where
(``failure``).
"""

from __future__ import annotations

import contextlib
import inspect
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import torch

from autoport_cst.errors import InputError

from . import compare, kernel_substitutes, lint_gate, rankless_check, sp_length_check
from .driver import PortFailure, PortOutput, PortSession, port_hf_config
from .fixed_precision import fixed_precision_verdict
from .follow_ups import FollowUps
from .forced_routing_verdict import forced_routing_verdict
from .fp8_cache_forcing import ForcingTally, port_cache_contents
from .inputs import MAX_TP, RunOptions
from .inputs import check_inputs as _check_inputs
from .inputs import check_prefill as _check_prefill
from .inputs import expert_count as _expert_count
from .kernel_precision import PolicyUnavailable, run_kernel_precision_reference
from .layout import ParallelLayout, check_layout
from .package import PortImportError, imported_package
from .reference import ReferenceOutput, greedy_teacher, load_reference, prompt_embeddings, run_reference
from .reference_reuse import keep_run, kept_run, sharing_reference_runs
from .report import PortFailureInfo, ValidationReport
from .routing import ForcedTeacher, RoutedRun, RoutingRecord, run_reference_routed
from .run_reuse import reused_run
from .run_scenario import describe_calls, plan_scenario, report_settings, with_decode_tokens
from .scenario import DEFAULT_STEPS, Scenario
from .unread_fields import recording_config_reads, unread_fields
from .vocab_shards import check_vocabulary_shards

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
VALIDATION_THREADS = 1  # torch intra-op threads per process (see _intra_op_threads)

# The stages ``on_stage`` reports, in order.
STAGES = ("load port", "reference fp32", "reference bf16", "run port", "compare")

StageCallback = Callable[[str], None]


@contextlib.contextmanager
def _intra_op_threads(count: int):
    """Run with ``count`` torch intra-op threads, restoring the caller's
    setting afterwards. Tiny models gain nothing from intra-op parallelism,
    and on a shared 2-vCPU machine the OpenMP hand-off of each small matmul
    costs up to 100x its work."""
    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def validate_model(
    model_dir: str | Path,
    checkpoint_dir: str | Path,
    *,
    tp: int = 1,
    dtype: str = "fp32",
    steps: int = DEFAULT_STEPS,
    prompt_lengths: tuple[int, ...] | None = None,
    block_size: int | None = None,
    seed: int = 0,
    on_stage: StageCallback | None = None,
    ep: int = 1,
    prefill: str = "auto",
    kv_cache_dtype: str = "auto",
    attention_dp: int = 1,
    mlp_dp: int = 1,
    embedding_dp: int = 1,
    lm_head_dp: int = 1,
    dcp: int = 1,
    dcp_interleave: int = 1,
    prefill_dcp: bool = False,
    config_variants: bool = True,
    parallel_layouts: bool = True,
    decode_tokens: int = 1,
    lint: bool = True,
) -> ValidationReport:
    """Run the port in ``model_dir`` and transformers on ``checkpoint_dir``
    through prefill and ``steps`` decode steps, and compare them.

    ``attention_dp``, ``mlp_dp``, ``embedding_dp``, ``lm_head_dp`` (> 1) run
    the decode graph with that data-parallel degree of the component, over
    ``tp * dp`` ranks (``dp`` the largest degree); ``dcp`` (> 1) with decode
    context parallelism inside TP, the KV cache interleaved in runs of
    ``dcp_interleave`` positions; ``prefill_dcp`` makes the prefill graph
    context-parallel too (``apply_prefill_dcp``). These run disaggregated, as
    vllm_neuron serves them (``autoport_cst.validate.layout_session``).

    ``ep > 1`` enables expert parallelism inside the ``tp`` ranks: ``ep``
    partitions of the experts (``tp`` must be a multiple of ``ep`` and the
    expert count of ``ep``); the port must read the EP degree and rank.
    ``prefill`` says whether the run takes the cache paths (a chunked
    prefill and a prefix-cache hit, both segmented): ``"auto"`` when the
    port reads ``kv_segment_size``, ``"segmented"`` always, ``"off"`` never.
    ``kv_cache_dtype="fp8"`` runs with an FP8 KV cache (emulated in
    ``float8_e4m3fn``); the cache paths then stay off unless asked for
    (segmented prefill needs a packed FP8 cache). ``decode_tokens > 1`` feeds
    that many new tokens per sequence in each decode call, as the runner's
    verification step of speculative decoding (``decode_tokens - 1`` draft
    tokens) does; a port whose forward takes no ``spec_decode_metadata``
    refuses it.

    ``config_variants``, ``parallel_layouts``: a passing plain TP=1 fp32 run
    goes on to its ``follow_ups.FollowUps``; the first that fails fails the report.

    ``lint``: once the input is checked, the package is linted with autoport-cst's
    hardware rules (``lint_gate``); an error fails the report at stage ``lint``
    without running the port, and the report's ``lint`` lists every finding."""
    layout = ParallelLayout(
        tp=tp,
        attention_dp=attention_dp,
        mlp_dp=mlp_dp,
        embedding_dp=embedding_dp,
        lm_head_dp=lm_head_dp,
        dcp=dcp,
        dcp_interleave=dcp_interleave,
        prefill_dcp=prefill_dcp,
        ep=ep,
    )
    options = {name: value for name, value in locals().items() if name in _RUN_OPTIONS}
    plain = (tp, ep, attention_dp, mlp_dp, embedding_dp, lm_head_dp, dcp, decode_tokens) == (1,) * 8
    follow_ups = None
    if plain and (dtype, kv_cache_dtype) == ("fp32", "auto"):
        follow_ups = FollowUps(model_dir, steps, prompt_lengths, seed, prefill, _validate)
    with _intra_op_threads(VALIDATION_THREADS), sharing_reference_runs():
        report = _linted_run(model_dir, checkpoint_dir, on_stage, options, lint)
        if report.equivalent and follow_ups is not None:
            follow_ups.check(report, checkpoint_dir, config_variants, parallel_layouts, on_stage)
        return report


# validate_model's arguments that say what one run is (``_plan``'s and ``_validate_run``'s)
_RUN_OPTIONS = frozenset(
    (
        "tp",
        "dtype",
        "steps",
        "prompt_lengths",
        "block_size",
        "seed",
        "ep",
        "prefill",
        "kv_cache_dtype",
        "layout",
        "decode_tokens",
    )
)


def _linted_run(
    model_dir: str | Path,
    checkpoint_dir: str | Path,
    on_stage: StageCallback | None,
    options: dict[str, Any],
    lint: bool,
) -> ValidationReport:
    """The run's input checked, the package linted (``lint_gate``, unless
    ``lint`` is false), then the run, unless a hardware rule is broken."""
    planned = _plan(model_dir, checkpoint_dir, **options)  # bad input first
    findings = lint_gate.lint_findings(planned.package_dir) if lint else []
    if lint_gate.failing(findings):
        return _broken_rules(planned, findings)
    report = _validate(model_dir, checkpoint_dir, on_stage=on_stage, **options)
    report.lint = [finding.to_dict() for finding in findings]
    return report


def _broken_rules(planned: _Planned, findings: list[Any]) -> ValidationReport:
    """The report of a port that breaks a hardware rule: not run, failed at
    ``lint``, each error named with its position and its fix."""
    errors = lint_gate.failing(findings)
    report = planned.report
    report.lint = [finding.to_dict() for finding in findings]
    report.failure = PortFailureInfo(lint_gate.STAGE, lint_gate.failure_message(errors, planned.package_dir))
    report.failed_checks = lint_gate.failed_checks(errors)
    report.timings = _finish({}, planned.started)
    return report


def _validate(
    model_dir: str | Path, checkpoint_dir: str | Path, *, on_stage: StageCallback | None, **options: Any
) -> ValidationReport:
    """``_validate_run``; within ``run_reuse.reusing_validation_runs`` the
    report of an earlier run with the same options on the same files (``port
    --tp 2``: the TP=2 layout of the TP=1 run is the ``--tp 2`` run). A
    caller that follows the stages runs anew."""
    if on_stage is not None:
        return _validate_run(model_dir, checkpoint_dir, on_stage=on_stage, **options)
    bound = inspect.signature(_validate_run).bind(model_dir, checkpoint_dir, on_stage=None, **options)
    bound.apply_defaults()  # an option left at its default is the same run as one given it
    key = {k: v for k, v in bound.arguments.items() if k not in ("model_dir", "checkpoint_dir", "on_stage")}
    return reused_run(
        model_dir,
        checkpoint_dir,
        key,
        lambda: _validate_run(model_dir, checkpoint_dir, on_stage=None, **options),
    )


def _validate_run(
    model_dir: str | Path,
    checkpoint_dir: str | Path,
    *,
    tp: int,
    dtype: str,
    steps: int,
    prompt_lengths: tuple[int, ...] | None,
    block_size: int | None,
    seed: int,
    on_stage: StageCallback | None,
    ep: int = 1,
    prefill: str = "auto",
    kv_cache_dtype: str = "auto",
    layout: ParallelLayout | None = None,
    prompt_embeds: bool = False,
    decode_tokens: int = 1,
    on_device_sampling: bool = False,
) -> ValidationReport:
    planned = _plan(
        model_dir,
        checkpoint_dir,
        tp=tp,
        dtype=dtype,
        steps=steps,
        prompt_lengths=prompt_lengths,
        block_size=block_size,
        seed=seed,
        ep=ep,
        prefill=prefill,
        kv_cache_dtype=kv_cache_dtype,
        layout=layout,
        decode_tokens=decode_tokens,
    )
    notify = on_stage or (lambda _stage: None)
    timings: dict[str, float] = {}
    report, scenario = planned.report, planned.scenario
    reference = _ReferenceRun(
        planned.checkpoint, scenario, steps, notify, timings, kv_cache_dtype=kv_cache_dtype, tp=tp
    )
    if prompt_embeds:
        scenario = reference.with_prompt_embeds(planned.layout, kv_cache_dtype, report.settings)
    if on_device_sampling:
        scenario = replace(scenario, on_device_sampling=True)
        report.settings["on_device_sampling"] = "greedy, with logprobs (sampled_output)"
    ran = _run_port(planned, scenario, notify, reference, timings)
    if ran is None:
        report.failed_checks = [f"port failed at {report.failure.stage}"]  # type: ignore[union-attr]
        report.timings = _finish(timings, planned.started)
        return report
    _compared(planned, scenario, reference, ran, timings)
    return report


@dataclass
class _Planned:
    """A run's checked input, its scenario and its report before anything runs."""

    package_dir: Path
    checkpoint: Path
    config: dict
    layout: ParallelLayout
    run: RunOptions
    scenario: Scenario
    report: ValidationReport
    started: float


def _plan(
    model_dir: str | Path,
    checkpoint_dir: str | Path,
    *,
    tp: int,
    dtype: str,
    steps: int,
    prompt_lengths: tuple[int, ...] | None,
    block_size: int | None,
    seed: int,
    ep: int = 1,
    prefill: str = "auto",
    kv_cache_dtype: str = "auto",
    layout: ParallelLayout | None = None,
    decode_tokens: int = 1,
) -> _Planned:
    """Check the run's input (``InputError``) and plan it: its layout, scenario
    and the report it fills."""
    package_dir, checkpoint, config = _check_inputs(model_dir, checkpoint_dir, tp, dtype, ep)
    layout = layout or ParallelLayout(tp=tp, ep=ep)
    check_layout(layout, config, MAX_TP)
    check_vocabulary_shards(package_dir, checkpoint, config, layout)
    run = RunOptions(dtype, _check_prefill(prefill, kv_cache_dtype), kv_cache_dtype)
    started = time.perf_counter()
    scenario = plan_scenario(config, checkpoint, layout, tp, steps, prompt_lengths, block_size, seed)
    scenario = with_decode_tokens(scenario, decode_tokens, config, layout)
    report = ValidationReport(
        model_dir=str(package_dir),
        checkpoint_dir=str(checkpoint),
        architecture=(config.get("architectures") or [None])[0],
        factory=None,
        settings=report_settings(run, layout, steps, seed, scenario),
        equivalent=False,
        tolerances=compare.tolerances(dtype),
    )
    return _Planned(package_dir, checkpoint, config, layout, run, scenario, report, started)


def _run_port(
    planned: _Planned,
    scenario: Scenario,
    notify: StageCallback,
    reference: _ReferenceRun,
    timings: dict[str, float],
) -> tuple[PortOutput, list[list[int]], str, dict] | None:
    """The port's run (in this process, or its ranks): its output, the
    teacher tokens, its factory and the stand-in's description; None when
    the port failed (``planned.report.failure`` says where)."""
    package_dir, checkpoint = planned.package_dir, planned.checkpoint
    run, layout = planned.run, planned.layout
    try:
        if layout.world == 1:
            return _run_in_process(package_dir, checkpoint, run, scenario, notify, reference, timings)
        return _run_ranks(package_dir, checkpoint, run, scenario, layout, notify, reference, timings)
    except PortFailure as failure:
        planned.report.failure = PortFailureInfo(
            failure.stage, failure.message, failure.refusal, failure.raised_in
        )
    except PortImportError as error:
        planned.report.failure = PortFailureInfo("import", str(error))
    return None


def _compared(
    planned: _Planned,
    scenario: Scenario,
    reference: _ReferenceRun,
    ran: tuple[PortOutput, list[list[int]], str, dict],
    timings: dict[str, float],
) -> None:
    """The port's run against transformers', into ``planned.report``: the
    reference runs an FP8 cache needs, the comparison, the forced-routing
    verdict of an MoE port, the timings."""
    port, teacher, factory_name, standin = ran
    report, dtype = planned.report, planned.run.dtype
    reference.complete(port, dtype)
    report.factory = factory_name
    report.settings["prefill_calls"] = describe_calls(port, scenario)
    report.environment = {
        "stand_in": standin,
        "torch": torch.__version__,
        "transformers": _transformers_version(),
    }
    reference.notify("compare")
    start = time.perf_counter()
    _compare(report, port, reference, scenario, teacher, dtype)
    fixed_precision_verdict(
        report, port, reference.outputs, lambda: reference.kernel_precision(teacher), scenario, teacher, dtype
    )
    reads = reference.outputs["fp32"].config_reads
    report.unread_config_fields = unread_fields(planned.config, reads, port.config_values)
    sp_length_check.apply(report, port.length_check)
    rankless_check.apply(report, port.rankless_check)
    kernel_substitutes.apply(report, planned.package_dir, planned.checkpoint)
    report.kv_cache = reference.tally.describe() if reference.tally is not None else None
    timings["compare"] = time.perf_counter() - start
    forced_routing_verdict(
        report,
        _PortRun(planned.package_dir, planned.checkpoint, planned.run, scenario, planned.layout),
        _expert_count(planned.config),
        teacher,
        timings,
    )
    for key, value in port.timings.items():
        timings[f"port_{key}"] = value
    report.timings = _finish(timings, planned.started)
    report.port_output = port


def _compare(
    report: ValidationReport,
    port: PortOutput,
    reference: _ReferenceRun,
    scenario: Scenario,
    teacher: list[list[int]],
    dtype: str,
) -> None:
    """The port's outputs against the reference's, into ``report``."""
    fp32, bf16 = reference.outputs["fp32"], reference.outputs.get("bf16")
    if dtype == "bf16" and bf16 is not None:
        result, report.bf16_baseline = compare.compare_bf16_baselines(
            port, fp32, bf16, lambda: reference.kernel_precision(teacher), scenario, teacher
        )
    else:
        result = compare.compare_all(port, fp32, bf16, scenario, teacher, dtype)
    report.take_comparison(result)
    report.unused_checkpoint_keys = list(port.unexpected_keys)


@dataclass
class _ReferenceRun:
    """The transformers side of a validation, run once while the port loads:
    the checkpoint in fp32 and in bf16 on the scenario's prompts, fed the
    fp32 model's greedy tokens (the teacher, which the port is fed too).
    ``outputs`` holds each run's output by dtype name, for the comparison."""

    checkpoint: Path
    scenario: Scenario
    steps: int
    notify: StageCallback
    timings: dict[str, float]
    outputs: dict[str, ReferenceOutput] = field(default_factory=dict)
    kv_cache_dtype: str = "auto"
    teacher: list[list[int]] = field(default_factory=list)
    # an FP8 run in fp32: what its cache took from the port's (``fp8_cache_forcing``)
    tally: ForcingTally | None = None
    tp: int = 1  # the kernels' precision policy sums the row-parallel projections over this many ranks

    def run(self) -> list[list[int]]:
        """Both reference runs; returns the teacher tokens (those of an
        earlier run on the same checkpoint while ``reusing_reference_runs``)."""
        prompts = self.scenario.prompts
        if self.kv_cache_dtype == "fp8":
            return self._fp8_teacher(prompts)
        kept = kept_run(self.checkpoint, prompts, self.steps)
        if kept is not None:
            teacher, self.outputs = kept
            return teacher
        start = time.perf_counter()
        self.notify("reference fp32")
        with recording_config_reads() as reads:
            model32 = load_reference(self.checkpoint, torch.float32)
            teacher = greedy_teacher(model32, prompts, self.steps)
            self.outputs["fp32"] = run_reference(model32, prompts, teacher)
        self.outputs["fp32"].input_embeddings = prompt_embeddings(model32, prompts)
        self.outputs["fp32"].config_reads = frozenset(reads)
        del model32
        self.timings["reference_fp32"] = time.perf_counter() - start
        start = time.perf_counter()
        self.notify("reference bf16")
        model16 = load_reference(self.checkpoint, torch.bfloat16)
        self.outputs["bf16"] = run_reference(model16, prompts, teacher)
        del model16
        self.timings["reference_bf16"] = time.perf_counter() - start
        keep_run(self.checkpoint, prompts, self.steps, teacher, self.outputs)
        return teacher

    def with_prompt_embeds(self, layout: ParallelLayout, kv_cache_dtype: str, settings: dict) -> Scenario:
        """The scenario with transformers' input embeddings of its prompts (the
        reference runs first, or is reused), which the port is fed in place of
        the ids at ``Scenario.embedded`` positions; noted in the report's ``settings``."""
        if layout.disaggregated or kv_cache_dtype != "auto":
            raise InputError("prompt embeddings are validated with plain TP and the model's KV-cache dtype")
        self.run()
        embeddings = self.outputs["fp32"].input_embeddings
        if embeddings is None:  # (every plain reference run computes them)
            raise InputError("no input embeddings of the prompts from the reference run")
        self.scenario = replace(self.scenario, prompt_embeds=tuple(embeddings))
        settings["prompt_embeds"] = "every odd prompt position"
        return self.scenario

    def _fp8_teacher(self, prompts: tuple[tuple[int, ...], ...]) -> list[list[int]]:
        """The teacher tokens of an FP8 KV-cache run, from the plain fp32
        model (those of an earlier plain run on the same checkpoint while
        ``reusing_reference_runs``); its reference runs follow the port's
        (``complete``)."""
        kept = kept_run(self.checkpoint, prompts, self.steps)
        if kept is not None:
            self.teacher = kept[0]
            return self.teacher
        start = time.perf_counter()
        self.notify("reference fp32")
        model = load_reference(self.checkpoint, torch.float32)
        self.teacher = greedy_teacher(model, prompts, self.steps)
        del model
        self.timings["reference_teacher"] = time.perf_counter() - start
        return self.teacher

    def complete(self, port: PortOutput, dtype: str) -> None:
        """An FP8 KV-cache run's reference runs, once the port has run: both
        with the port's FP8 cache (``fp8_reference``), the fp32 one
        teacher-forced from the values the port stored when it ran in fp32
        in this process (``fp8_cache_forcing``)."""
        if self.kv_cache_dtype != "fp8" or self.outputs:
            return
        from .fp8_reference import fp8_cache_runner

        run = fp8_cache_runner(self.checkpoint)
        forced = port.fp8_cache if dtype == "fp32" else None
        self.tally = ForcingTally() if forced is not None else None
        prompts, teacher = self.scenario.prompts, self.teacher
        for name, torch_dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
            start = time.perf_counter()
            self.notify(f"reference {name} (FP8 KV cache)")
            model = load_reference(self.checkpoint, torch_dtype)
            stored = forced if name == "fp32" else None
            self.outputs[name] = run(model, prompts, teacher, port=stored, tally=self.tally)
            del model
            self.timings[f"reference_{name}"] = time.perf_counter() - start

    def kernel_precision(self, teacher: list[list[int]]) -> ReferenceOutput | str:
        """transformers in bf16 at the kernels' precision policy (the second
        bf16 baseline), or why the model has none."""
        start = time.perf_counter()
        from .fp8_reference import fp8_cache_runner

        run = fp8_cache_runner(self.checkpoint) if self.kv_cache_dtype == "fp8" else run_reference
        try:
            return run_kernel_precision_reference(
                self.checkpoint, self.scenario.prompts, teacher, run=run, row_parallel=self.tp
            )
        except PolicyUnavailable as reason:
            return str(reason)
        finally:
            self.timings["reference_bf16_kernel_precision"] = time.perf_counter() - start

    def then_port(self) -> list[list[int]]:
        """The reference runs, then the port's stage begins (the ranks run
        the port once they are handed the teacher tokens)."""
        teacher = self.run()
        self.notify("run port")
        return teacher


class _TeacherSource(Protocol):
    """What a port run asks for its teacher tokens (``_ReferenceRun`` computes them)."""

    def run(self) -> list[list[int]]: ...

    def then_port(self) -> list[list[int]]: ...


@dataclass(frozen=True)
class _PortRun:
    """How to run the port again (the teacher-forced routing run)."""

    package_dir: Path
    checkpoint: Path
    run: RunOptions
    scenario: Scenario
    layout: ParallelLayout

    def __call__(self, teacher: ForcedTeacher) -> PortOutput:
        given = _GivenTeacher(teacher)
        if self.layout.world == 1:
            return _run_in_process(
                self.package_dir, self.checkpoint, self.run, self.scenario, given.notify, given, {}
            )[0]
        return _run_ranks(
            self.package_dir, self.checkpoint, self.run, self.scenario, self.layout, given.notify, given, {}
        )[0]

    def reference(
        self, teacher: list[list[int]], experts: int
    ) -> Callable[..., tuple[ReferenceOutput, RoutedRun]]:
        """transformers recording its expert choices (fp32), or forced (bf16)."""

        def run(forced: RoutingRecord | None, bf16: bool) -> tuple[ReferenceOutput, RoutedRun]:
            model = load_reference(self.checkpoint, torch.bfloat16 if bf16 else torch.float32)
            return run_reference_routed(model, self.scenario.prompts, teacher, experts, forced)

        return run


@dataclass
class _GivenTeacher:
    """Stands for ``_ReferenceRun`` in a second port run: the teacher is given."""

    teacher: list[list[int]]

    def run(self) -> list[list[int]]:
        return self.teacher

    def then_port(self) -> list[list[int]]:
        return self.teacher

    def notify(self, stage: str) -> None:
        pass


def _finish(timings: dict[str, float], started: float) -> dict[str, float]:
    timings["total"] = time.perf_counter() - started
    return {key: round(value, 4) for key, value in timings.items()}


def _transformers_version() -> str:
    import transformers

    return transformers.__version__


def _checkpoint_load_failure(checkpoint: Path, error: Exception) -> Exception:
    """A port that cannot load the checkpoint: bad input when transformers
    refuses the checkpoint too (a missing or misshapen tensor), else the
    port's failure at ``load`` (exit code 1); the message names the
    parameter and the checkpoint key."""
    try:
        load_reference(checkpoint, torch.float32)
    except InputError as refused:
        return InputError(
            f"the port cannot load the checkpoint: {error}\n(transformers refuses it too: {refused})"
        )
    return PortFailure("load", f"the port cannot load a checkpoint transformers loads: {error}")


def _run_in_process(
    package_dir: Path,
    checkpoint: Path,
    run: RunOptions,
    scenario: Scenario,
    notify: StageCallback,
    reference: _TeacherSource,
    timings: dict[str, float],
) -> tuple[PortOutput, list[list[int]], str, dict]:
    from .standin import standin_installed
    from .standin.checkpoints import CheckpointError
    from .standin.dtype_utils import KV_CACHE_DTYPES

    start = time.perf_counter()
    notify("load port")
    with (
        standin_installed(model=str(checkpoint), cache_dtype=run.kv_cache_dtype) as installation,
        imported_package(package_dir) as package,
    ):
        hf_config = port_hf_config(checkpoint, DTYPES[run.dtype])
        try:
            session = PortSession(
                package.factory,
                checkpoint,
                hf_config,
                scenario,
                prefill=run.prefill,
                kv_cache_dtype=KV_CACHE_DTYPES.get(run.kv_cache_dtype),
            )
        except CheckpointError as error:
            raise _checkpoint_load_failure(checkpoint, error) from error
        timings["port_setup"] = time.perf_counter() - start
        teacher = reference.run()
        notify("run port")
        start = time.perf_counter()
        output = session.run(teacher)
        if run.kv_cache_dtype == "fp8":  # what it stored, for the reference's cache (fp8_cache_forcing)
            output.fp8_cache = port_cache_contents(session.caches, scenario, output.sequences)
        timings["port_run"] = time.perf_counter() - start
        return output, teacher, package.factory_name, installation.describe()


def _run_ranks(
    package_dir: Path,
    checkpoint: Path,
    run: RunOptions,
    scenario: Scenario,
    layout: ParallelLayout,
    notify: StageCallback,
    reference: _TeacherSource,
    timings: dict[str, float],
) -> tuple[PortOutput, list[list[int]], str, dict]:
    from .distributed import RankCheckpointError, merge_layout_outputs, merge_rank_outputs, run_port_ranks

    notify("load port")
    start = time.perf_counter()
    try:
        outputs, factory_name, description, teacher = run_port_ranks(
            package_dir,
            checkpoint,
            run.dtype,
            scenario,
            layout.world,
            reference.then_port,
            ep_degree=layout.ep,
            prefill=run.prefill,
            kv_cache_dtype=run.kv_cache_dtype,
            layout=layout if layout.disaggregated else None,
        )
    except RankCheckpointError as error:
        raise _checkpoint_load_failure(checkpoint, error) from error
    timings["port_ranks"] = time.perf_counter() - start
    if layout.disaggregated:
        return merge_layout_outputs(outputs, scenario, layout), teacher, factory_name, description
    merged = merge_rank_outputs(outputs, scenario)
    merged.routing = _merged_routing(outputs)
    return merged, teacher, factory_name, description


def _merged_routing(outputs: list[PortOutput]) -> RoutedRun | None:
    """The ranks' own expert choices together (each rank routes its
    sequence-parallel slice in prefill)."""
    runs = [o.routing for o in outputs if o.routing is not None]
    if not runs:
        return None
    merged = RoutedRun(RoutingRecord())
    for run in runs:
        merged.merge(run)
    return merged
