"""``autoport-cst plan``: research a model and write the plan ``apply`` consumes.

transformers is imported inside the command only (through the research),
so importing ``autoport_cst.cli`` stays cheap.

Exit codes: 0 plan written and portable (a reference realizes it; or, with
``--review``, declined), 1 plan written but not portable (the model has
computations no reference realizes, ``spec.unsupported`` among them: the
blocking features are listed), 2 bad input (missing or malformed
config.json, no modeling source for the model_type, an unreadable or
truncated safetensors file, an invalid name, a --review without an answer);
nothing is written then; 130 interrupted.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from autoport_cst.atomic import write_atomic
from autoport_cst.cli.common import EXIT_FOUND, error_boundary, stderr_console, stdout_console
from autoport_cst.errors import InputError
from autoport_cst.preflight import (
    check_model_name,
    check_output_file,
    check_reference,
    check_source,
    default_model_name,
    require_extra,
)


@click.command("plan")
@click.argument("source")
@click.option(
    "--name",
    default=None,
    help="Model name in snake_case: the package directory of the port. Default: the checkpoint's "
    "model_type (openai-gpt -> openai_gpt).",
)
@click.option(
    "-o",
    "--output",
    "output",
    default="plan.json",
    show_default=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Where to write the plan.",
)
@click.option(
    "--ref",
    "ref",
    default=None,
    help="Reference to measure and use (a built-in name or a reference directory). "
    "Default: the built-in reference with the smallest realizable diff.",
)
@click.option(
    "--review",
    is_flag=True,
    help="Show the analysis and ask before writing (y/N, or the path of an edited plan).",
)
@error_boundary
def plan_command(source: str, name: str | None, output: Path, ref: str | None, review: bool) -> None:
    """Research SOURCE and write a plan for `autoport-cst apply`.

    SOURCE is a local checkpoint directory (config.json and optionally
    *.safetensors) or a Hugging Face hub id (needs the network). The
    research reads config.json, analyses the transformers modeling source of
    the model_type as code, and reads the safetensors headers (no tensor is
    loaded); it picks the reference with the smallest realizable diff and
    the tensor/expert-parallel sizes for a trn2.48xlarge.
    """
    if name is not None:
        check_model_name(name)
    check_output_file(output, "-o")
    check_reference(ref)  # a bad --ref is bad input, before any research
    config = check_source(source)
    name = name if name is not None else default_model_name(config, source)
    require_extra("plan", ("transformers",))
    from autoport_cst.plan import from_research, load_plan, plan_to_json
    from autoport_cst.research import choose_reference, research

    if ref:
        from autoport_cst.apply.reference import load_reference

        load_reference(ref)
    result = research(source)
    choice = choose_reference(result.spec, name, result.architecture, [ref] if ref else None, result)
    # the reference as given (a directory): the chosen name is its manifest's
    result = _with_reference_vocabulary(result, (ref or choice.chosen) if choice.chosen else None)
    description = _description(result, choice)
    plan = from_research(result, name, choice.chosen, description)  # the written plan always loads
    data = plan_to_json(plan)
    edited = False
    console = stdout_console()
    print_analysis(console, result, choice)
    if review:
        answer = _ask(f"Write {output}? [y/N] or the path of an edited plan")
        if answer.lower() in ("y", "yes"):
            pass
        elif answer.lower() in ("", "n", "no"):
            stderr_console().print("plan not written")
            return
        else:
            plan, edited = load_plan(answer), True
            data = plan_to_json(plan)
            stderr_console().print(f"using the edited plan {answer}")
    write_atomic(output, json.dumps(data, indent=2) + "\n")
    console.print(f"wrote {output} (reference {plan.reference or 'none'}, class prefix {plan.prefix})")
    for step in plan.steps:  # the assumptions a port of this plan makes (docs/planning.md)
        if step.codemod == "config-guards":
            guarded = ", ".join(
                f"{a['field']} entries in {a['allowed']!r}"
                if a.get("allowed")
                else f"{a['field']} = {a['value']!r}"
                for a in step.params.get("assumed", ())
            )
            console.print(f"config guards (the port refuses other values): {guarded}", markup=False)
    blocked = _not_portable(plan, choice, edited)
    if blocked:
        from rich.markup import escape

        stderr_console().print(f"[bold]not portable[/]: {escape(blocked)}")
        sys.exit(EXIT_FOUND)


def _with_reference_vocabulary(result: Any, chosen: str | None) -> Any:
    """The research with its TP sizes checked against the chosen reference:
    one that shards the vocabulary unpadded (the real vllm_neuron llama3 and
    qwen3) takes only a TP that divides it
    (``research.parallelism.unpadded_vocabulary``)."""
    if chosen is None:
        return result
    import dataclasses

    from autoport_cst.apply.reference import load_reference
    from autoport_cst.research.parallelism import unpadded_vocabulary
    from autoport_cst.validate.vocab_shards import unpadded_sites_named

    reference = load_reference(chosen)
    sites = unpadded_sites_named(reference.files)
    if sites is None:
        return result
    named = f"the reference {reference.manifest.name} ({sites})"
    return dataclasses.replace(result, parallel=unpadded_vocabulary(result.parallel, named))


def _not_portable(plan, choice, edited: bool) -> str | None:
    """Why the written plan is not portable (its blocking features), or None.
    An edited plan is composed as ``apply`` would (its reference, its steps)."""
    if not edited:
        return None if choice.realizable else choice.reason
    from autoport_cst.apply.composer import compose
    from autoport_cst.apply.reference import load_reference
    from autoport_cst.errors import AutoportError, UnrealizableDiffError

    if plan.reference is None:
        return "the plan names no reference"
    try:
        compose(plan, load_reference(plan.reference))
    except UnrealizableDiffError as error:
        return f"{plan.reference} does not realize {', '.join(error.features)}"
    except AutoportError as error:  # the plan is written: what apply would say of it
        return str(error).splitlines()[0]
    return None


def _ask(question: str) -> str:
    """The answer of --review, read from the terminal (or a pipe); an input
    that ends first is bad input: nothing is written."""
    try:
        return click.prompt(question, default="N", show_default=False).strip()
    except click.exceptions.Abort as abort:
        if isinstance(abort.__cause__ or abort.__context__, KeyboardInterrupt):
            raise KeyboardInterrupt from None
        raise InputError(
            "--review asks before writing, but stdin ended without an answer (no terminal?): "
            "plan not written; run it in a terminal, pipe the answer in (echo y | autoport-cst plan "
            "... --review), or leave out --review"
        ) from None


def _description(result, choice) -> str:
    parts = [f"Planned by autoport-cst from {result.source} ({result.model_type}, {result.architecture})."]
    if result.unknown:
        parts.append(f"Unclassified (defaults kept, check by hand): {', '.join(result.unknown)}.")
    if result.conflicts:
        parts.append(f"Conflicts: {', '.join(sorted({c.field for c in result.conflicts}))}.")
    if not choice.realizable:
        parts.append(f"No reference realizes this diff: {choice.reason}")
    return " ".join(parts)


# ---- output ---------------------------------------------------------------------


def _show(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, dict):
        return ", ".join(f"{k}={_show(v)}" for k, v in value.items())
    if isinstance(value, (tuple, list)):
        if len(value) > 4:
            counts: dict[Any, int] = {}
            for item in value:
                counts[item] = counts.get(item, 0) + 1
            return ", ".join(f"{k} x{n}" for k, n in counts.items())
        return ", ".join(_show(v) for v in value)
    return str(value)


def analysis_rows(result, choice) -> list[tuple[str, str, str, str]]:
    """(section, reference, target, change needed) for every spec field."""
    from autoport_cst.spec import ArchSpec, get_field, leaf_fields

    candidate = choice.candidate(choice.chosen) if choice.chosen else None
    plans = {f.path: f for f in candidate.fields} if candidate else {}
    ref_spec = None
    if choice.chosen:
        from autoport_cst.apply.reference import load_reference

        ref_spec = load_reference(choice.chosen).spec
    rows = []
    unknown = set(result.unknown)
    for path, role, _ in leaf_fields(ArchSpec):
        if path.startswith("moe.") and result.spec.moe is None:
            continue
        target = get_field(result.spec, path)
        if path == "moe":
            if target is None and (ref_spec is None or ref_spec.moe is None):
                continue
            target = "MoE" if target is not None else None
        reference = get_field(ref_spec, path) if ref_spec is not None else None
        if path == "moe":
            reference = "MoE" if reference is not None else None
        plan = plans.get(path)
        if plan is None:
            change = "-"
        elif plan.how == "config":
            change = "read from the config"
        elif plan.how == "blocked":
            change = "BLOCKED: no codemod"
        else:
            change = plan.how
        if path in unknown:
            kept = "the value says so" if target == "unknown" else "default kept"
            change = f"UNKNOWN ({kept}); {change}"
        ref_text = _show(reference) if reference is not None or role != "value" else "(config)"
        rows.append((path, ref_text, _show(target), change))
    return rows


def print_analysis(console, result, choice) -> None:
    from rich.markup import escape
    from rich.table import Table

    console.print(f"[bold]{escape(result.source)}[/]: {result.model_type}, {result.architecture}")
    console.print(f"  modeling source: {escape(result.modeling_source or '-')}", markup=True)
    files = ", ".join(result.checkpoint_files) or "none (config and code only)"
    p = result.parameters
    console.print(f"  checkpoint: {escape(files)}")
    console.print(
        f"  parameters: {p.total:,} ({p.source}: {escape(p.evidence)})"
        + (f", {p.experts:,} in routed experts" if p.experts else "")
    )
    table = Table(title=f"architecture: reference {choice.chosen or 'none'} vs target", title_justify="left")
    table.add_column("section", no_wrap=True)
    for column in ("reference", "target", "change needed"):
        table.add_column(column, overflow="fold")
    for row in analysis_rows(result, choice):
        style = None
        if row[3].startswith(("BLOCKED", "UNKNOWN")):
            style = "red"
        elif row[3] != "-":
            style = "yellow"
        table.add_row(*(escape(c) for c in row), style=style)
    console.print(table)
    console.print(f"[bold]reference:[/] {escape(choice.reason)}")
    for candidate in choice.candidates:
        if candidate.error:
            console.print(f"  {candidate.name}: unusable ({escape(candidate.error)})")
        elif candidate.blocking:
            console.print(f"  {candidate.name}: blocked by {escape(', '.join(candidate.blocking))}")
        else:
            console.print(
                f"  {candidate.name}: {len(candidate.code_changes)} codemod field(s), "
                f"steps {escape(', '.join(candidate.steps) or '-')}"
            )
    if result.unknown:
        console.print("[bold red]unknown[/] (no source could classify; the plan keeps the default):")
        for name in result.unknown:
            decision = result.decision(name)
            console.print(f"  {name}: {escape(decision.evidence if decision else '')}")
    if result.conflicts:
        console.print("[bold red]conflicts[/]:")
        for conflict in result.conflicts:
            claims = "; ".join(f"{c.source} says {_show(c.value)} ({c.evidence})" for c in conflict.claims)
            console.print(
                f"  [{conflict.severity}] {conflict.field}: {escape(claims)} -> {escape(conflict.resolution)}"
            )
    notes = [
        f
        for f in result.findings
        if f.field
        in (
            "checkpoint.unexpected_keys",
            "checkpoint.missing_keys",
            "config.sliding_window_unused",
            "code.activation_fixed",
            "config.num_experts_unused",
            "code.dense_layers",
            "code.norm_affine",
        )
    ]
    if notes:
        console.print("[bold]notes[/]:")
        for note in notes:
            console.print(f"  {note.field}: {escape(note.evidence)}")
    if result.pitfalls:
        console.print("[bold]pitfalls for this model[/]:")
        for item in result.pitfalls:
            console.print(f"  - {escape(item)}")
    print_parallel(console, result.parallel)


def print_parallel(console, parallel) -> None:
    from rich.markup import escape
    from rich.table import Table

    table = Table(
        title=f"tensor parallelism (trn2.48xlarge: {parallel.world_size} ranks, "
        f"{parallel.budget_bytes / 1e9:.0f} GB bf16 weights per rank)",
        title_justify="left",
    )
    for column in ("TP", "valid", "GB per rank", "fits", "why not / notes"):
        table.add_column(column, overflow="fold")
    for check in parallel.checks:
        table.add_row(
            str(check.tp),
            "yes" if check.valid else "no",
            f"{check.bytes_per_rank / 1e9:.2f}",
            "yes" if check.fits else "no",
            escape("; ".join(check.failures + check.notes) or "-"),
            style="green" if check.tp == parallel.recommended_tp else None,
        )
    console.print(table)
    console.print(f"[bold]recommendation:[/] {escape(parallel.reason)}")
    if parallel.ep_options:
        for option in parallel.ep_options:
            console.print(
                f"  EP {option.ep} x TP {option.tp}: {option.local_experts} experts per rank, "
                f"{option.bytes_per_rank / 1e9:.2f} GB per rank{'' if option.fits else ' (does not fit)'}"
            )
    for inside in parallel.ep_inside_tp:
        console.print(
            f"  EP {inside.ep} inside TP {inside.tp}: {inside.local_experts} experts per rank, "
            f"{inside.expert_slice} intermediate columns of each, {inside.bytes_per_rank / 1e9:.2f} GB per rank"
            f"{'' if inside.fits else ' (does not fit)'}"
        )
