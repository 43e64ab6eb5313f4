"""``autoport-cst apply``: port a reference model according to a plan."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from autoport_cst.cli.common import (
    EXIT_FOUND,
    EXIT_OK,
    error_boundary,
    process_ends_with_command,
    put_back_leftovers,
    stderr_console,
    stdout_console,
)
from autoport_cst.cli.plain_table import plain_table
from autoport_cst.collector import collector_paused
from autoport_cst.errors import InputError


@click.command("apply")
@click.option(
    "--plan",
    "plan_path",
    required=True,
    type=click.Path(dir_okay=False),
    help="plan.json describing the port.",
)
@click.option(
    "--ref",
    "ref",
    default=None,
    help="Reference: a built-in name (llama3) or a reference directory. Default: the plan's `reference`.",
)
@click.option(
    "--out",
    "out_dir",
    default=None,
    type=click.Path(file_okay=False),
    help="Output root: the port goes to OUT/vllm_neuron/model/<name>/.",
)
@click.option(
    "--diff", "show_diff", is_flag=True, help="Print the change against the reference and write nothing."
)
@click.option(
    "--check",
    is_flag=True,
    help="Write nothing; exit 1 when the files under --out differ from what apply would write.",
)
@click.option("--force", is_flag=True, help="Replace an existing model package (and its registry entry).")
@click.option(
    "--output-format",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="Summary format.",
)
@click.option("--quiet", "-q", is_flag=True, help="No summary; errors only.")
@error_boundary
def apply_command(plan_path, ref, out_dir, show_diff, check, force, output_format, quiet):
    """Port a reference model package according to PLAN.

    The codemods are composed from the architecture diff between the
    reference and the plan's target spec (plus the plan's explicit steps),
    applied to every file of the reference package, and the port is written
    with its registry entry, an example and a logit test: all of it or
    nothing. Exit codes: 0 done, 1 `--check` found differences, 2 bad input
    or a failed codemod precondition (nothing written), 130 interrupted.
    """
    with collector_paused(lift=not process_ends_with_command()):  # the collector never runs in apply
        _apply(plan_path, ref, out_dir, show_diff, check, force, output_format, quiet)


def _apply(plan_path, ref, out_dir, show_diff, check, force, output_format, quiet) -> None:
    from autoport_cst.apply import build_port, differences, load_reference, write_port
    from autoport_cst.apply.engine import REGISTRY
    from autoport_cst.plan import load_plan

    if check and show_diff:
        raise click.UsageError("--check and --diff are mutually exclusive")
    if (check or not show_diff) and out_dir is None:
        raise click.UsageError("--out is required (except with --diff)")
    plan = load_plan(plan_path)
    ref_name = ref or plan.reference
    if ref_name is None:
        raise InputError(f"{plan_path}: no reference: pass --ref or set `reference` in the plan")
    if ref and plan.reference and ref != plan.reference and not quiet:
        stderr_console().print(f"note: --ref {ref} overrides the plan's reference {plan.reference}")
    reference = load_reference(ref_name)

    out = Path(out_dir) if out_dir else None
    if out is not None and not show_diff:  # --check writes nothing: a leftover is refused there
        put_back_leftovers(out, restore=not check)
    existing_registry = None
    if out is not None and (out / REGISTRY).is_file():
        existing_registry = (out / REGISTRY).read_text(encoding="utf-8")
    result = build_port(
        plan,
        reference,
        existing_registry=existing_registry,
        plan_source=str(plan_path),
        replace_registry_entry=force,
    )
    if result.failure is not None:
        if getattr(result.failure, "step", None) == "register-model" and out is not None:
            raise InputError(
                f"{out} already holds a port of {plan.architecture} (its registry maps each "
                f"architecture to one port): apply into another --out, or map the architecture to this "
                f"port instead: autoport-cst apply --plan {plan_path} --out {out} --force\n({result.failure})"
            )
        raise result.failure

    if show_diff:
        _print_diff(result, reference)
        if not quiet:
            _summary(result, None, output_format, to_stderr=True)
        sys.exit(EXIT_OK)

    assert out is not None  # --out is required without --diff
    if check:
        changed = differences(out, result.files, result.package_dir)
        if output_format == "json":
            print(json.dumps({"changed": changed}, indent=2))
        elif changed:
            console = stdout_console()
            for path in changed:
                console.print(f"would change: {out / path}")
        elif not quiet:
            stderr_console().print(f"{out}: up to date")
        sys.exit(EXIT_FOUND if changed else EXIT_OK)

    report = write_port(out, result.files, result.package_dir, force)
    if not quiet:
        _summary(result, report, output_format, to_stderr=False, out=out)
    sys.exit(EXIT_OK)


def _print_diff(result, reference) -> None:
    import difflib

    console = stdout_console()
    chunks: list[str] = []
    for path, new in result.files.items():
        old = result.sources.get(path, "")
        if old == new:
            continue
        source = _source_label(path, result, reference)
        chunks.extend(
            difflib.unified_diff(
                old.splitlines(keepends=True),
                new.splitlines(keepends=True),
                fromfile=f"a/{source}",
                tofile=f"b/{path}",
            )
        )
    text = "".join(chunks)
    if not text:
        return
    if console.is_terminal:
        from rich.syntax import Syntax

        console.print(Syntax(text, "diff", theme="ansi_dark", word_wrap=False))
    else:
        sys.stdout.write(text)


def _source_label(path, result, reference) -> str:
    prefix = result.package_dir + "/"
    if path.startswith(prefix):
        return f"{reference.name}/{path[len(prefix) :]}"
    for name, template in reference.manifest.companions.items():
        if template.format(name=result.plan.name) == path:
            return f"{reference.name}/companions/{name}"
    return path


_SUMMARY_HEADERS = ("#", "codemod", "origin", "realizes", "files changed", "text edits")
_RIGHT_ALIGNED = (0, 4, 5)


def _summary(result, report, output_format: str, to_stderr: bool, out: Path | None = None) -> None:
    stream = sys.stderr if to_stderr else sys.stdout
    if output_format == "json":
        stream.write(json.dumps(_summary_data(result, report), indent=2) + "\n")
        return
    title = f"{result.plan.name}: ported from {result.reference.name}"
    rows = [
        (
            str(number),
            step.codemod,
            step.origin,
            ", ".join(step.realizes) or "-",
            str(len(step.changed)),
            str(len(step.notes)),
        )
        for number, step in enumerate(result.steps, 1)
    ]
    lines = _summary_lines(result, report, out)
    if not stream.isatty():  # a pipe or a file: plain text, and no import of rich
        stream.write(plain_table(title, _SUMMARY_HEADERS, rows, _RIGHT_ALIGNED))
        stream.writelines(text + "\n" for text, _ in lines)
        return
    from rich.table import Table

    console = stderr_console() if to_stderr else stdout_console()
    table = Table(title=title, title_justify="left")
    for number, header in enumerate(_SUMMARY_HEADERS):
        table.add_column(header, justify="right" if number in _RIGHT_ALIGNED else "left")
    for row in rows:
        table.add_row(*row)
    console.print(table)
    for text, style in lines:
        console.print(text, style=style, markup=False)


def _summary_lines(result, report, out: Path | None) -> list[tuple[str, str | None]]:
    """The lines under the summary table, each with its terminal style."""
    lines: list[tuple[str, str | None]] = []
    if result.composition.by_config:
        fields = ", ".join(d.path for d in result.composition.by_config)
        lines.append((f"read from the config at run time: {fields}", None))
    for warning in result.warnings:
        lines.append((f"warning: {_warning_text(warning)}", "yellow"))
    notes = [n for s in result.steps for n in s.notes]
    if notes:
        lines.append((f"text edits in strings, docstrings and comments ({len(notes)}):", None))
        lines.extend((f"  {note}", "dim") for note in notes)
    if report is not None:
        lines.append(
            (
                f"wrote {len(report.written)} file(s) under {out} "
                f"({len(report.unchanged)} unchanged, {len(report.removed)} removed)",
                None,
            )
        )
    return lines


def _warning_text(warning) -> str:
    """``path:line:column: CODE message (note)`` of a lint warning on the port."""
    note = f" ({warning.note})" if warning.note else ""
    return f"{warning.path}:{warning.line}:{warning.column}: {warning.code} {warning.message}{note}"


def _summary_data(result, report) -> dict:
    data = {
        "plan": result.plan.name,
        "reference": result.reference.name,
        "steps": [
            {
                "codemod": s.codemod,
                "origin": s.origin,
                "params": s.params,
                "realizes": list(s.realizes),
                "changed": list(s.changed),
                "notes": [str(n) for n in s.notes],
            }
            for s in result.steps
        ],
        "by_config": [d.path for d in result.composition.by_config],
        "warnings": [_warning_text(w) for w in result.warnings],
        "files": sorted(result.files),
    }
    if report is not None:
        data.update(
            written=list(report.written), unchanged=list(report.unchanged), removed=list(report.removed)
        )
    return data
