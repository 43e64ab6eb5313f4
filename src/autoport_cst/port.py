"""``port`` = plan + apply + validate, as one function with results as data.

The research decides the target spec and the reference; the engine writes the
port; the port is validated on CPU against transformers. By default the
validation checkpoint is a tiny random model built from the source's own
config (same architecture and features, small dimensions), so any model can be
checked in seconds; ``checkpoint="source"`` validates on the source's weights.

A port "validates" only when every run (TP=1 in fp32 and bf16, and fp32 at the
requested TP size) is equivalent within the documented tolerances.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autoport_cst.config_json import checkpoint_is_vision_language, parse_config_text
from autoport_cst.errors import InputError, PreconditionError, UnrealizableDiffError
from autoport_cst.validation_runs import ValidationRun, first_diverging, max_abs

if TYPE_CHECKING:
    from autoport_cst.apply.writer import PendingWrite

STAGES = ("research", "apply", "checkpoint", "validate")

# what port(settle_imports=True) imports first in the research stage (the
# research, the engine with LibCST, transformers' configuration classes) and
# in the checkpoint stage (transformers' modeling code, the validator):
# autoport_cst.settled_imports
RESEARCH_IMPORTS = (
    "autoport_cst.research",
    "autoport_cst.apply",
    "autoport_cst.plan",
    "transformers.models.auto.configuration_auto",
)
VALIDATION_IMPORTS = (
    "transformers.modeling_utils",
    "autoport_cst.validate.api",
    "autoport_cst.validate.tiny",
)


@dataclass
class PortOutcome:
    name: str
    architecture: str
    reference: str | None = None
    plan_path: Path | None = None
    package_dir: Path | None = None
    checkpoint_dir: Path | None = None
    steps: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)
    runs: list[ValidationRun] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    seed: int = 0
    # configs the plan was not made on (autoport_cst.port_variants): the varied
    # fields (field -> [planned, varied]), the run on them, a GuardCheck per guard
    variant: dict[str, list] = field(default_factory=dict)
    variant_runs: list[ValidationRun] = field(default_factory=list)
    guards: list = field(default_factory=list)

    @property
    def validated(self) -> bool:
        runs = [*self.runs, *self.variant_runs]
        return bool(self.runs) and all(r.equivalent for r in runs) and all(g.refused for g in self.guards)

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": 1,
            "name": self.name,
            "architecture": self.architecture,
            "reference": self.reference,
            "plan": str(self.plan_path) if self.plan_path else None,
            "package": str(self.package_dir) if self.package_dir else None,
            "checkpoint": str(self.checkpoint_dir) if self.checkpoint_dir else None,
            "steps": self.steps,
            "unknown": self.unknown,
            "validated": self.validated,
            "runs": [vars(r) for r in self.runs],
            "seconds": self.seconds,
            "seed": self.seed,
            "variant": self.variant,
            "variant_runs": [vars(r) for r in self.variant_runs],
            "guards": [vars(g) for g in self.guards],
        }


def port(
    source: str,
    name: str,
    out: Path,
    *,
    tp: int = 1,
    ref: str | None = None,
    checkpoint: str = "tiny",
    steps: int = 16,
    seed: int = 0,
    force: bool = False,
    on_stage: Callable[[str], None] | None = None,
    settle_imports: bool = False,
) -> PortOutcome:
    """Plan, apply and validate. Raises InputError (bad input) and
    UnrealizableDiffError (a feature no codemod realizes, named).

    ``settle_imports`` (a one-shot process: the command line): the research
    and the validation first import the heavy modules they need as blocks
    that later garbage collections skip (``autoport_cst.settled_imports``);
    the same work and results, less time collecting."""
    from autoport_cst.settled_imports import import_settled

    def stage(label: str) -> None:
        if on_stage is not None:
            on_stage(label)

    _check_input(name, checkpoint, tp)
    out = Path(out)

    stage("research")
    start = time.perf_counter()
    if settle_imports:
        import_settled(RESEARCH_IMPORTS)
    found, choice = _research(source, name, ref)
    outcome = PortOutcome(name, found.architecture, unknown=list(found.unknown), seed=seed)
    outcome.seconds["research"] = time.perf_counter() - start

    stage("apply")
    start = time.perf_counter()
    written = _apply(outcome, found, choice, source, out, ref, force)
    outcome.seconds["apply"] = time.perf_counter() - start

    checkpoints_before: Any = _UNLISTED
    try:
        checkpoints_before = _checkpoint_entries(out)
        # a run killed outright (SIGKILL) has these removed with its port by the next write into out
        written.will_create(out, [out / "checkpoints" / f"{name}-tiny{kind}" for kind in CHECKPOINT_KINDS])
        stage("checkpoint")
        start = time.perf_counter()
        if settle_imports:
            import_settled(VALIDATION_IMPORTS)
        outcome.checkpoint_dir = port_checkpoint(outcome, found, out, checkpoint)
        outcome.seconds["checkpoint"] = time.perf_counter() - start
        _validate(outcome, found, checkpoint, tp, steps, seed, stage)
    except BaseException:
        # no verdict (Ctrl-C, bad input found late, an error): no port of this
        # run stays registered; an earlier port under ``out`` is put back, and
        # the checkpoints this run made are removed
        from autoport_cst.interrupts import interrupts_deferred

        with interrupts_deferred():  # a second Ctrl-C does not stop the rollback halfway
            written.rollback()
            if checkpoints_before is not _UNLISTED:
                _remove_new_checkpoints(out, name, checkpoints_before)
        raise
    written.commit()  # a verdict: the port stays, validated or not (exit 0 or 1)
    _record_validations(outcome, out, checkpoint, steps, seed)
    return outcome


def _check_input(name: str, checkpoint: str, tp: int) -> None:
    from autoport_cst.plan.naming import model_name_problem

    name_problem = model_name_problem(name)
    if name_problem is not None:
        raise InputError(f"--name {name_problem}")
    if checkpoint not in ("tiny", "source"):
        raise InputError(f"--checkpoint must be tiny or source, got {checkpoint!r}")
    if tp < 1:
        raise InputError(f"--tp must be at least 1, got {tp}")


def _research(source: str, name: str, ref: str | None) -> tuple[Any, Any]:
    """The research and the reference choice; a model no reference can be
    turned into is refused here."""
    from autoport_cst.apply import load_reference
    from autoport_cst.research import choose_reference, research

    if ref:
        load_reference(ref)
    found = research(source)
    choice = choose_reference(found.spec, name, found.architecture, [ref] if ref else None, found)
    refused = refusal(found, choice)
    if refused is not None:
        raise refused
    return found, choice


def _validate(
    outcome: PortOutcome, found: Any, checkpoint: str, tp: int, steps: int, seed: int, stage: Callable
) -> None:
    """The validation runs, then, when they pass, the checks on configs the
    plan was not made on. The runs on the validation checkpoint share one
    transformers run (``reference_reuse``): the port's dtype and TP size do
    not change what transformers computes; nor is a run repeated (``run_reuse``:
    with ``--tp 2`` the TP=1 fp32 run's TP=2 layout is the ``--tp 2`` run)."""
    from autoport_cst.validate.reference_reuse import reusing_reference_runs
    from autoport_cst.validate.run_reuse import reusing_validation_runs

    start = time.perf_counter()
    _check_source_vocabulary(outcome, found, tp)
    _check_validation_tp(outcome, tp)
    with reusing_reference_runs(), reusing_validation_runs():
        _validation_runs(outcome, checkpoint, tp, steps, seed, stage)
    outcome.seconds["validate"] = time.perf_counter() - start
    if outcome.validated and not checkpoint_is_vision_language(outcome.checkpoint_dir or "."):
        # then on configs the plan was not made on (text decoders: validate_vlm runs no variants)
        from autoport_cst.port_variants import check_config_variants

        start = time.perf_counter()
        check_config_variants(outcome, found, checkpoint, steps, seed, stage)
        outcome.seconds["variants"] = time.perf_counter() - start


def _apply(
    outcome: PortOutcome, found: Any, choice: Any, source: str, out: Path, ref: str | None, force: bool
) -> PendingWrite:
    """Write the port and its plan from the first realizable reference whose
    code has the shape the codemods need (only ``ref`` when given); the
    write is pending (``apply.writer.PendingWrite``) until the verdict."""
    from autoport_cst.apply import build_port, load_reference
    from autoport_cst.apply.engine import REGISTRY
    from autoport_cst.apply.writer import write_port_pending
    from autoport_cst.plan import from_research, plan_to_json

    name = outcome.name
    attempts: list[tuple[str, PreconditionError]] = []
    for reference_name in [ref] if ref else [c.name for c in choice.realizable_in_order()]:
        plan = from_research(
            found,
            name,
            choice.chosen if ref else reference_name,
            f"Planned by autoport-cst port from {found.source}.",
            "<port plan>",
        )
        reference = load_reference(reference_name)
        registry = out / REGISTRY
        result = build_port(
            plan,
            reference,
            existing_registry=registry.read_text(encoding="utf-8") if registry.is_file() else None,
            plan_source="<port plan>",
            replace_registry_entry=force,
        )
        if isinstance(result.failure, PreconditionError) and result.failure.realizes:
            # this reference's code does not have the shape the codemod
            # needs: try the next realizable reference
            attempts.append((reference_name, result.failure))
            continue
        if result.failure is not None:
            raise _second_port(result.failure, source, name, out, found.architecture) or result.failure
        break
    else:
        raise _precondition_refusal(found, attempts)
    outcome.reference = reference.name
    plan_file = f"plans/{name}.plan.json"
    files = dict(result.files)
    files[plan_file] = json.dumps(plan_to_json(plan), indent=2) + "\n"
    written = write_port_pending(out, files, result.package_dir, force)
    outcome.plan_path = out / plan_file
    outcome.package_dir = out / result.package_dir
    outcome.steps = [s.codemod for s in result.steps]
    return written


def _validation_runs(
    outcome: PortOutcome, checkpoint: str, tp: int, steps: int, seed: int, stage: Callable[[str], None]
) -> None:
    """TP=1 in fp32 and in bf16, and fp32 at ``tp`` when it is larger; a tiny
    checkpoint the port cannot load ends the runs (the port's failure)."""
    from autoport_cst.validate import validate_model

    runs = [(1, "fp32"), (1, "bf16")] + ([(tp, "fp32")] if tp > 1 else [])
    vision_language = checkpoint_is_vision_language(outcome.checkpoint_dir or ".")
    for run_tp, dtype in runs:
        label = f"validate tp={run_tp} {dtype}"
        stage(label)
        # the TP=1 runs report their own stages and follow-up runs; the --tp run is
        # the TP=1 run's layout of that size when there was one (run_reuse), unannounced
        within = None if run_tp > 1 else (lambda inner, label=label: stage(f"{label}: {inner}"))
        t0 = time.perf_counter()
        if vision_language:
            outcome.runs.append(_vision_language_run(outcome, run_tp, dtype, steps, seed, t0))
            continue
        try:
            report = validate_model(
                outcome.package_dir,
                outcome.checkpoint_dir,
                tp=run_tp,
                dtype=dtype,
                steps=steps,
                seed=seed,
                on_stage=within,
            )
        except InputError as error:
            # The checkpoint was made from the model's own config, so a tensor
            # the port cannot find or shape is the port's fault, not bad input.
            if checkpoint != "tiny":
                raise
            outcome.runs.append(
                ValidationRun(
                    run_tp, dtype, False, str(error), f"load: {error}", None, time.perf_counter() - t0
                )
            )
            break
        outcome.runs.append(
            ValidationRun(
                tp=run_tp,
                dtype=dtype,
                equivalent=report.equivalent,
                summary=report.summary(),
                first_diverging=first_diverging(report),
                max_abs_error=max_abs(report),
                seconds=time.perf_counter() - t0,
            )
        )
        if report.failure is not None and report.failure.stage == "lint":
            break  # a broken hardware rule: every run would refuse it alike (validate.lint_gate)


def _vision_language_run(
    outcome: PortOutcome, tp: int, dtype: str, steps: int, seed: int, t0: float
) -> ValidationRun:
    """One run of a vision-language port through ``validate_vlm`` (its
    prompts with and without images, tower and decoder compared)."""
    from autoport_cst.validate.vision_validate import validate_vlm

    assert outcome.package_dir is not None and outcome.checkpoint_dir is not None  # applied, checkpoint made
    report = validate_vlm(
        outcome.package_dir, outcome.checkpoint_dir, dtype=dtype, steps=steps, seed=seed, tp=tp
    )
    diverging = None if report.equivalent else (report.first_diverging or f"failure: {report.failure_stage}")
    return ValidationRun(
        tp, dtype, report.equivalent, report.summary(), diverging, None, time.perf_counter() - t0
    )


def _record_validations(outcome: PortOutcome, out: Path, checkpoint: str, steps: int, seed: int) -> None:
    """What the port's logit test reruns (``autoport_cst.validation_record``):
    every run, a tiny checkpoint by its config and weights seed, the source's
    by its directory, the config variant by its directory."""
    from autoport_cst.validation_record import port_test_dir, run_record, save_runs

    checkpoint_dir = outcome.checkpoint_dir
    assert checkpoint_dir is not None  # the checkpoint stage ran
    weights_seed = seed if checkpoint == "tiny" else None
    records = [
        run_record(checkpoint_dir, tp=r.tp, dtype=r.dtype, steps=steps, seed=seed, weights_seed=weights_seed)
        for r in outcome.runs
    ]
    variant = checkpoint_dir.parent / f"{checkpoint_dir.name}-variant"  # port_variants'
    for r in outcome.variant_runs:
        if (variant / "config.json").is_file():
            records.append(
                run_record(variant, tp=r.tp, dtype=r.dtype, steps=steps, seed=seed, label="variant")
            )
    save_runs(out / port_test_dir(outcome.name), records, merge=False)


def _second_port(failure, source: str, name: str, out: Path, architecture: str) -> InputError | None:
    """The registry under ``out`` maps the architecture to another port: say
    so in ``port``'s terms (one port per architecture per --out)."""
    if getattr(failure, "step", None) != "register-model":
        return None
    return InputError(
        f"{out} already holds a port of {architecture} (its registry maps each architecture to one "
        f"port): port into another --out, or map the architecture to this port instead: autoport-cst port "
        f"{source} --name {name} --out {out} --force\n({failure})"
    )


def _check_validation_tp(outcome: PortOutcome, tp: int) -> None:
    """A TP size the rules refuse for the validation checkpoint is refused
    before any rank process starts (``port`` then keeps no port of this run)."""
    from autoport_cst.research.parallelism import tp_refusal
    from autoport_cst.validate.api import MAX_TP

    assert outcome.checkpoint_dir is not None  # the checkpoint stage ran
    config_path = outcome.checkpoint_dir / "config.json"
    config = parse_config_text(config_path.read_text(encoding="utf-8"))
    refusal = tp_refusal(config, tp) if isinstance(config, dict) else None
    if tp > MAX_TP:
        refusal = f"validation runs at most {MAX_TP} local ranks"
    if refusal is not None:
        raise InputError(
            f"--tp {tp}: {refusal} (sizes of the validation checkpoint {config_path}); no port is "
            f"kept under {outcome.package_dir}: port again at a TP the rules accept"
        )


def _check_source_vocabulary(outcome: PortOutcome, found, tp: int) -> None:
    """A port that shards the vocabulary unpadded (the real vllm_neuron
    llama3 and qwen3's LM heads) runs on device only at a TP size that
    divides the model's own vocabulary: another ``--tp`` is refused (exit 2),
    naming the site, whatever the tiny checkpoint's vocabulary."""
    from autoport_cst.validate.vocab_shards import vocabulary_refusal

    config_path = Path(found.source) / "config.json"
    if tp == 1 or outcome.package_dir is None or not config_path.is_file():
        return
    config = parse_config_text(config_path.read_text(encoding="utf-8"))
    refusal = (
        vocabulary_refusal(outcome.package_dir, config, tp, for_port=True)
        if isinstance(config, dict)
        else None
    )
    if refusal is not None:
        raise InputError(
            f"--tp {tp}: {refusal} (the model's own vocabulary, {config_path}); no port is kept under "
            f"{outcome.package_dir}"
        )


def port_checkpoint(outcome: PortOutcome, found, out: Path, checkpoint: str) -> Path:
    """The checkpoint the written port is validated on (``checkpoint``:
    ``tiny`` or ``source``), sized for how the port shards its vocabulary."""
    vocabulary = _tiny_vocabulary(outcome.package_dir)
    return _validation_checkpoint(found, out, outcome.name, checkpoint, outcome.seed, vocabulary)


def _tiny_vocabulary(package_dir: Path | None) -> dict[str, int]:
    """The tiny checkpoint's vocabulary: the tiny default (511, which no TP
    size divides, so that the padding of the LM head and the embedding is
    exercised), or 512 for a port that shards it unpadded (its TP and DP runs
    then build; the model's own vocabulary is checked against ``--tp``
    apart)."""
    from autoport_cst.validate.vocab_shards import unpadded_site

    return {"vocab_size": 512} if package_dir is not None and unpadded_site(package_dir) else {}


def _validation_checkpoint(found, out: Path, name: str, checkpoint: str, seed: int, vocabulary: dict) -> Path:
    source_dir = Path(found.source)
    if checkpoint == "source":
        if not source_dir.is_dir() or not any(source_dir.glob("*.safetensors")):
            raise InputError(f"{found.source}: --checkpoint source needs a local directory with safetensors")
        return source_dir
    from autoport_cst.validate import build_tiny_checkpoint

    config = source_dir / "config.json" if source_dir.is_dir() else None
    target = out / "checkpoints" / f"{name}-tiny"
    if getattr(getattr(found, "spec", None), "vision", None) is not None:
        from autoport_cst.validate.vision_tiny import build_tiny_vlm_checkpoint

        return build_tiny_vlm_checkpoint(target, seed=seed, architecture=found.architecture)
    arch = str(config) if config and config.is_file() else found.architecture
    # the planned config's dense / MoE layers: the port's config guard refuses others
    build_tiny_checkpoint(arch, target, seed=seed, dimensions=vocabulary or None, keep_layer_kinds=True)
    if _key_format_differs(source_dir, target):
        # the port loads the source's keys: write the tiny checkpoint as the
        # source was written (save_pretrained's hub layout) when that fits better
        saved = out / "checkpoints" / f"{name}-tiny-saved"
        build_tiny_checkpoint(
            arch, saved, seed=seed, dimensions=vocabulary or None, key_format="saved", keep_layer_kinds=True
        )
        if _key_overlap(source_dir, saved) > _key_overlap(source_dir, target):
            return saved
    return target


# the checkpoints a port makes under OUT/checkpoints: <name>-tiny<kind> (_validation_checkpoint, port_variants)
CHECKPOINT_KINDS = ("", "-saved", "-variant", "-saved-variant")
_UNLISTED = object()  # OUT/checkpoints not listed yet: nothing of it is removed


def _checkpoint_entries(out: Path) -> set[str] | None:
    """The names under OUT/checkpoints (None: there is no such directory)."""
    directory = out / "checkpoints"
    return {p.name for p in directory.iterdir()} if directory.is_dir() else None


def _remove_new_checkpoints(out: Path, name: str, before: set[str] | None) -> None:
    """Remove the checkpoints of port ``name`` that this run made under
    OUT/checkpoints (``{name}-tiny``, ``-tiny-saved``, their ``-variant``), and
    the directory itself when the run made it and it is left empty; what was
    there before the run stays."""
    import shutil

    directory = out / "checkpoints"
    if not directory.is_dir():
        return
    for path in directory.iterdir():
        if path.name not in (before or set()) and path.name.startswith(f"{name}-tiny"):
            shutil.rmtree(path, ignore_errors=True)
    if before is None:
        try:
            directory.rmdir()
        except OSError:  # not empty: another run's files
            pass


def _key_patterns(directory: Path) -> set[str]:
    from autoport_cst.research.checkpoint import pattern, read_checkpoint

    header = read_checkpoint(directory) if directory.is_dir() else None
    return {pattern(name) for name in header.tensors} if header is not None else set()


def _key_overlap(source: Path, tiny: Path) -> int:
    return len(_key_patterns(source) & _key_patterns(tiny))


def _key_format_differs(source: Path, tiny: Path) -> bool:
    """The source checkpoint stores tensors the tiny one names otherwise."""
    stored = _key_patterns(source)
    return bool(stored) and not _key_patterns(tiny) <= stored


def refusal(found, choice) -> UnrealizableDiffError | None:
    """The error that refuses a researched model no reference can be turned
    into, naming the features no reference realizes in the user's terms
    (``research.refusal``); None when a reference was chosen."""
    if choice.realizable and choice.chosen is not None:
        return None
    from autoport_cst.research.refusal import minimal_blocking, refusal_text

    blocked, _ = minimal_blocking(choice)
    text, named = refusal_text(found.spec, choice, found)
    features = list(dict.fromkeys(b.field for b in named))
    closest = choice.candidate(choice.chosen) if choice.chosen else None
    message = f"{found.architecture} cannot be ported: {text}"
    if closest is not None and closest.error is None:
        message += f"\n  closest reference: {closest.name} (blocked by {', '.join(closest.blocking)})"
    return UnrealizableDiffError(message, blocked, features)


def _precondition_refusal(found, attempts) -> UnrealizableDiffError:
    """Every realizable reference failed a codemod precondition: the features
    those codemods were to realize are what no codemod realizes here, named
    in the user's terms."""
    from autoport_cst.research.refusal import blockers

    features = list(dict.fromkeys(path for _, error in attempts for path in error.realizes))
    named = "; ".join(b.describe() for b in blockers(found.spec, features))
    lines = [f"  from {ref}: {error}" for ref, error in attempts]
    return UnrealizableDiffError(
        f"{found.architecture} cannot be ported: no reference's code has the shape the codemods need to "
        f"realize {named}\n" + "\n".join(lines),
        features,
        features,
    )
