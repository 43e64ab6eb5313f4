"""``autoport-cst port``: plan, apply and validate in one command."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from autoport_cst.cli.common import EXIT_FOUND, EXIT_OK, error_boundary, stderr_console, stdout_console


@click.command("port")
@click.argument("source")
@click.option("--name", required=True, help="Model name in snake_case (the package directory).")
@click.option(
    "--out",
    "out_dir",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Output root: the port goes to OUT/vllm_neuron/model/<name>/, its plan to OUT/plans/.",
)
@click.option(
    "--tp",
    type=int,
    default=1,
    show_default=True,
    help="Also validate at this tensor-parallel size (TP=1 always runs).",
)
@click.option("--ref", default=None, help="Reference to port from; default: the closest built-in one.")
@click.option(
    "--checkpoint",
    type=click.Choice(["tiny", "source"]),
    default="tiny",
    show_default=True,
    help="Validate on a tiny random checkpoint built from SOURCE's config, or on SOURCE's weights.",
)
@click.option("--steps", type=int, default=16, show_default=True, help="Decode steps per validation run.")
@click.option(
    "--seed",
    type=int,
    default=0,
    show_default=True,
    help="Seed of the tiny checkpoint's weights and of the validation prompts.",
)
@click.option("--force", is_flag=True, help="Replace an existing port of this name.")
@click.option(
    "--json",
    "json_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write the outcome as JSON here.",
)
@error_boundary
def port_command(source, name, out_dir, tp, ref, checkpoint, steps, seed, force, json_path):
    """Port SOURCE (a checkpoint directory or hub id) end to end.

    Research the model, write the plan, apply the codemods to the closest
    reference, and validate the port on CPU against transformers (TP=1 in fp32
    and bf16, plus fp32 at --tp). Exit 0 only when every validation run is
    equivalent; 1 when the port does not validate (naming the first diverging
    component); 2 on bad input or an architecture with a feature no codemod
    realizes (named).
    """
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from autoport_cst.port import STAGES, port

    console = stderr_console()
    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as progress:
        task = progress.add_task("starting", total=len(STAGES))

        def on_stage(label: str) -> None:
            progress.update(task, description=label, advance=0 if label == STAGES[0] else 1)

        outcome = port(
            source,
            name,
            out_dir,
            tp=tp,
            ref=ref,
            checkpoint=checkpoint,
            steps=steps,
            seed=seed,
            force=force,
            on_stage=on_stage,
        )
    _print(outcome)
    if json_path is not None:
        json_path.write_text(json.dumps(outcome.to_dict(), indent=2) + "\n", encoding="utf-8")
    sys.exit(EXIT_OK if outcome.validated else EXIT_FOUND)


def _print(outcome) -> None:
    from rich.table import Table

    console = stdout_console()
    console.print(f"{outcome.architecture} -> {outcome.package_dir} (reference {outcome.reference})")
    console.print(f"steps: {', '.join(outcome.steps)}")
    if outcome.unknown:
        console.print(
            f"not classified by the research (defaults kept): {', '.join(outcome.unknown)}", style="yellow"
        )
    table = Table(title="validation against transformers", title_justify="left")
    for column in ("tp", "dtype", "verdict", "first diverging", "max abs error", "seconds"):
        table.add_column(column)
    for run in outcome.runs:
        table.add_row(
            str(run.tp),
            run.dtype,
            "equivalent" if run.equivalent else "NOT equivalent",
            run.first_diverging or "-",
            "-" if run.max_abs_error is None else f"{run.max_abs_error:.3g}",
            f"{run.seconds:.1f}",
        )
    console.print(table)
    total = sum(outcome.seconds.values())
    stages = ", ".join(f"{k} {v:.1f}s" for k, v in outcome.seconds.items())
    console.print(f"total {total:.1f}s ({stages})")
    verdict = "PORTED and validated" if outcome.validated else "port written but does NOT validate"
    console.print(verdict, style="bold green" if outcome.validated else "bold red")
