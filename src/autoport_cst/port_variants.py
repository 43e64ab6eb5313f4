"""``port``'s validation beyond the planned config.

A port is registered for every checkpoint of its architecture, so once it
validates on the planned config, ``port`` checks it on configs that differ
in every field the research found the computation depends on
(:mod:`autoport_cst.plan.assumptions`):

- the fields the port reads at run time are all varied at once in a second
  random checkpoint (of the tiny validation checkpoint's sizes, unshrunk),
  on which the port must validate (TP=1, fp32); a field the port's own
  code refuses by name while building (a ``ValueError`` naming the field and
  the varied value: GPT-OSS's kernels fix ``swiglu_alpha``) counts as a
  refusal, and the variant runs again without it;
- each guarded field is set, alone, to a value the port was not made for:
  building the port from that config must raise naming the field and both
  values.

With ``--checkpoint source`` only the guards are checked (a second checkpoint
of the source's size would cost as much as the model).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from autoport_cst.validate.variants import GuardCheck


def check_config_variants(
    outcome: Any, found: Any, checkpoint: str, steps: int, seed: int, stage: Callable[[str], None]
) -> None:
    """Fill ``outcome.variant``, ``outcome.variant_runs`` and
    ``outcome.guards`` for a port that validated on its planned config."""
    from autoport_cst.plan.plan_file import assumptions_of
    from autoport_cst.validate.variants import guard_checks, read_values, variant_values

    assumptions = assumptions_of(found, _plan_reference(outcome))
    base = read_values(outcome.checkpoint_dir)
    if assumptions.guards:
        stage("config guards")
        outcome.guards = guard_checks(outcome.package_dir, base, assumptions.guards, outcome.checkpoint_dir)
    if checkpoint != "tiny":
        return
    fields = list(assumptions.runtime)
    tied = [(g.field, g.same_as) for g in assumptions.guards if getattr(g, "same_as", None) is not None]
    dependence = getattr(found, "config_dependence", None)
    # an entry of a part's config that is None here (MPT's attn_config.softmax_scale) is varied
    # to the value research varied it to, by its class's annotation
    given = {
        p.field: p.varied
        for p in getattr(dependence, "probes", ())
        if p.value is None and "." in p.field and not p.given
    }
    while True:
        values, changed = variant_values(base, fields, tied, given)
        if not changed:
            return
        stage("config variant")
        run, report = _variant_run(outcome, values, changed, steps, seed, stage)
        refused = _refused_field(report, changed)
        if refused is None:
            outcome.variant = {name: list(pair) for name, pair in changed.items()}
            outcome.variant_runs.append(run)
            return
        # the port's own check refuses that value by name (GPT-OSS's kernels
        # fix swiglu_alpha): a refusal, as a guard's; the rest is varied again
        planned, varied = changed[refused]
        outcome.guards.append(GuardCheck(refused, varied, planned, True, report.failure.message))
        fields.remove(refused)


def _plan_reference(outcome: Any) -> str | None:
    """The reference as the written plan names it (a built-in name, or the
    path given as ``--ref``): the one its guards were judged against."""
    import json

    if outcome.plan_path is not None and outcome.plan_path.is_file():
        return json.loads(outcome.plan_path.read_text(encoding="utf-8")).get("reference")
    return outcome.reference


def _refused_field(report: Any, changed: dict) -> str | None:
    """The varied field a port that failed at build names, with its varied
    value, in a ``ValueError`` or ``NotImplementedError`` of its own."""
    failure = getattr(report, "failure", None)
    if failure is None or failure.stage != "build":
        return None
    message = failure.message
    if not message.startswith(("ValueError", "NotImplementedError")):
        return None
    return next(
        (f for f, (_, new) in changed.items() if f.rsplit(".", 1)[-1] in message and repr(new) in message),
        None,
    )


def _variant_run(
    outcome: Any, values: dict, changed: dict, steps: int, seed: int, stage: Callable[[str], None]
) -> tuple[Any, Any]:
    from autoport_cst.errors import InputError
    from autoport_cst.validate import validate_model
    from autoport_cst.validate.tiny import key_format_of
    from autoport_cst.validate.variants import build_variant_checkpoint
    from autoport_cst.validation_runs import ValidationRun, first_diverging, max_abs

    label = "variant: " + ", ".join(f"{k}={after!r}" for k, (_, after) in changed.items())
    start = time.perf_counter()
    directory = outcome.checkpoint_dir.parent / f"{outcome.checkpoint_dir.name}-variant"
    try:
        build_variant_checkpoint(values, directory, seed, key_format_of(outcome.checkpoint_dir))
    except Exception as error:  # noqa: BLE001 - transformers refuses the varied config
        reason = f"transformers cannot build the varied config ({type(error).__name__}: {error})"
        return ValidationRun(1, "fp32", False, reason, "variant: build", None, 0.0, label), None
    try:
        report = validate_model(
            outcome.package_dir,
            directory,
            tp=1,
            dtype="fp32",
            steps=steps,
            seed=seed,
            on_stage=lambda inner: stage(f"config variant: {inner}"),
        )
    except InputError as error:  # made from a config transformers builds: the port's fault
        run = ValidationRun(
            1, "fp32", False, str(error), f"load: {error}", None, time.perf_counter() - start, label
        )
        return run, None
    return ValidationRun(
        tp=1,
        dtype="fp32",
        equivalent=report.equivalent,
        summary=report.summary(),
        first_diverging=first_diverging(report),
        max_abs_error=max_abs(report),
        seconds=time.perf_counter() - start,
        config=label,
    ), report


def config_check_lines(outcome: Any) -> list[str]:
    """What the checks beyond the planned config found, one line each."""
    lines = []
    changed = ", ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in outcome.variant.items())
    for run in outcome.variant_runs:
        verdict = "equivalent" if run.equivalent else f"NOT equivalent: {run.summary}"
        lines.append(f"config variant (the fields the port reads at run time, varied: {changed}): {verdict}")
    for check in outcome.guards:
        verdict = "refused" if check.refused else f"NOT refused by name ({check.message})"
        lines.append(
            f"config guard: {check.field} = {check.value!r} (made for {check.expected!r}): {verdict}"
        )
    return lines
