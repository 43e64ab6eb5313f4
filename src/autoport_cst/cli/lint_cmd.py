"""``autoport-cst lint``: check files against the Trainium hardware rules.

Exit codes: 0 clean, 1 violations remain (or ``--diff`` found changes, or
``--exit-non-zero-on-fix`` changed a file), 2 usage, configuration or
internal error, 141 the reader of the output went away (``| head``).
Diagnostics go to stdout, the summary to stderr.
"""

from __future__ import annotations

import sys

import click

from autoport_cst.cli.common import EXIT_ERROR, EXIT_FOUND, EXIT_OK, error_boundary

FORMATS = ("text", "json", "sarif", "github")


def _split(values: tuple[str, ...]) -> list[str] | None:
    out = [v.strip() for value in values for v in value.split(",") if v.strip()]
    return out or None


def _err(message: str) -> None:
    click.echo(message, err=True)


@click.command("lint")
@click.argument("paths", nargs=-1, type=click.Path())
@click.option("--fix", is_flag=True, help="Apply safe fixes (the codemods) and write the files.")
@click.option(
    "--unsafe-fixes", is_flag=True, help="Also apply fixes that change numerics (e.g. float32-router)."
)
@click.option(
    "--diff", is_flag=True, help="Print the fixes as a unified diff instead of writing; exit 1 if any."
)
@click.option(
    "--select",
    multiple=True,
    metavar="CODES",
    help="Only these rules (codes, prefixes or names; comma-separated, repeatable).",
)
@click.option(
    "--ignore",
    multiple=True,
    metavar="CODES",
    help="Skip these rules (codes, prefixes or names; comma-separated, repeatable).",
)
@click.option("--output-format", type=click.Choice(FORMATS), default="text", show_default=True)
@click.option("--statistics", is_flag=True, help="Print a count per rule instead of each finding.")
@click.option("--exit-zero", is_flag=True, help="Exit 0 even when violations are found.")
@click.option(
    "--exit-non-zero-on-fix", is_flag=True, help="Exit 1 when --fix changed a file, even if nothing remains."
)
@click.option("--no-cache", is_flag=True, help="Neither read nor write the result cache.")
@click.option(
    "--cache-dir",
    type=click.Path(file_okay=False),
    help="Cache directory (default: .autoport-cst-cache next to the configuration).",
)
@click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False),
    help="Use this pyproject.toml instead of discovering one per file.",
)
@click.option(
    "--force-exclude",
    is_flag=True,
    help="Apply `exclude` to files named on the command line too (for pre-commit).",
)
@click.option("-j", "--jobs", type=click.IntRange(min=1), help="Worker processes.")
@click.option("--explain", metavar="CODE", help="Print a rule's documentation and exit.")
@click.option("--list-rules", is_flag=True, help="List the rules and exit.")
@error_boundary
def lint_command(*args, **kwargs):
    """Check Python files and directories (default: .) against the Trainium
    hardware rules of vllm_neuron models.

    Suppress one finding with a trailing comment naming the code and a reason:
    `# autoport: ignore[NRN002] reason`. Configure in [tool.autoport-cst.lint]
    of pyproject.toml."""
    return _lint(*args, **kwargs)  # `| head`: error_boundary exits 141


def _lint(
    paths,
    fix,
    unsafe_fixes,
    diff,
    select,
    ignore,
    output_format,
    statistics,
    exit_zero,
    exit_non_zero_on_fix,
    no_cache,
    cache_dir,
    config_file,
    force_exclude,
    jobs,
    explain,
    list_rules,
):
    from autoport_cst.lint import output
    from autoport_cst.lint.runner import RunOptions, run

    if list_rules or explain:
        sys.exit(_describe(explain))
    if config_file is not None:
        import os

        if not os.path.isfile(config_file):
            raise click.UsageError(f"--config: no such file: {config_file}")
    options = RunOptions(
        fix=fix,
        diff=diff,
        unsafe_fixes=unsafe_fixes,
        select=_split(select),
        ignore=_split(ignore),
        use_cache=not no_cache,
        config=config_file,
        force_exclude=force_exclude,
        jobs=jobs,
        cache_dir=cache_dir,
    )
    report = run(list(paths) or ["."], options)
    diagnostics = report.diagnostics
    unsafe = unsafe_fixes

    if diff:
        _print_diffs(report)
        if diagnostics:
            _err(output.text(diagnostics, unsafe).rstrip("\n"))
    elif statistics:
        sys.stdout.write(output.statistics(diagnostics, output_format, unsafe))
    else:
        sys.stdout.write(output.render(output_format, report.results, diagnostics, unsafe))
    sys.stdout.flush()

    for result in report.results:
        for problem in result.fix_problems:
            _err(f"{result.path}: note: {problem.message}")
    for error in report.errors:
        _err(f"error: {error}")
    fixable_count = 0 if fix or diff else _fixable_count(report, options, unsafe)
    _summary(report, diagnostics, fix, diff, unsafe, fixable_count)

    if report.errors:
        sys.exit(EXIT_ERROR)
    if exit_zero:
        sys.exit(EXIT_OK)
    failing = any(d.severity == "error" for d in diagnostics)
    changed = any(r.changed for r in report.results)
    if failing or (diff and changed) or (fix and exit_non_zero_on_fix and changed):
        sys.exit(EXIT_FOUND)
    sys.exit(EXIT_OK)


def _print_diffs(report) -> None:
    import difflib

    for result in report.results:
        if not result.changed:
            continue
        diff = difflib.unified_diff(
            result.original.splitlines(keepends=True),
            result.fixed.splitlines(keepends=True),
            fromfile=f"a/{result.path}",
            tofile=f"b/{result.path}",
        )
        sys.stdout.writelines(
            line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in diff
        )


def _fixable_count(report, options, unsafe: bool) -> int:
    """How many findings ``--fix`` would fix: the fixes run dry on the files
    whose findings offer one, since an offered fix can turn out not to apply
    (lazy-rope on a class that keeps using the tensor it would move)."""
    from dataclasses import replace

    from autoport_cst.lint.output import fixable
    from autoport_cst.lint.runner import run

    paths = [r.path for r in report.results if any(fixable(d, unsafe) for d in r.diagnostics)]
    if not paths:
        return 0
    dry = run(paths, replace(options, diff=True, fix=False))
    return sum(r.fixed_count for r in dry.results)


def _summary(report, diagnostics, fix: bool, diff: bool, unsafe: bool, can_fix: int) -> None:
    files = len(report.results)
    errors = sum(1 for d in diagnostics if d.severity == "error")
    warnings = sum(1 for d in diagnostics if d.severity == "warning")
    changed = [r for r in report.results if r.changed]
    fixed = sum(r.fixed_count for r in report.results)
    checked = f"{files} file{'s' if files != 1 else ''} checked"
    if report.cache_hits:
        checked += f" ({report.cache_hits} cached)"
    if diff:
        _err(
            f"Would fix {fixed} violation{'s' if fixed != 1 else ''} in {len(changed)} "
            f"file{'s' if len(changed) != 1 else ''}; {errors} remaining; {checked}."
        )
        return
    if fix:
        _err(
            f"Fixed {fixed} violation{'s' if fixed != 1 else ''} in {len(changed)} "
            f"file{'s' if len(changed) != 1 else ''}; {errors} remaining; {checked}."
        )
        return
    if not errors and not warnings:
        _err(f"All checks passed! ({checked})")
        return
    hidden = sum(1 for d in diagnostics if d.fix is not None and not d.fix.safe and not unsafe)
    parts = [f"Found {errors} error{'s' if errors != 1 else ''}"]
    if warnings:
        parts.append(f"{warnings} warning{'s' if warnings != 1 else ''}")
    line = ", ".join(parts) + f" ({checked})."
    if can_fix:
        line += f" {can_fix} fixable with --fix."
    if hidden:
        line += f" {hidden} more fixable with --unsafe-fixes."
    _err(line)


def _describe(code: str | None) -> int:
    from autoport_cst.lint.rules import registry

    rules = registry()
    if code is None:
        for c, rule in rules.items():
            fix = f" [fix: {rule.FIX}{'' if rule.FIX_SAFE else ', unsafe'}]" if rule.FIX else ""
            click.echo(f"{c}  {rule.NAME}{fix}: {rule.summary()}")
        return EXIT_OK
    by_name = {rule.NAME: c for c, rule in rules.items()}
    key = code.upper() if code.upper() in rules else by_name.get(code)
    if key is None:
        _err(f"error: unknown rule {code!r}")
        return EXIT_ERROR
    rule = rules[key]
    click.echo(f"{key} {rule.NAME}\n")
    click.echo(rule.documentation())
    if rule.OPTIONS:
        click.echo("\nOptions ([tool.autoport-cst.lint.options." + key + "]):")
        for name, opt in rule.OPTIONS.items():
            click.echo(f"  {name} ({opt.type}, default {opt.default!r}): {opt.doc}")
    return EXIT_OK
