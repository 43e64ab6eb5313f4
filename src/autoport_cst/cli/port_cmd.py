"""``autoport-cst port``: plan, apply and validate in one command."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from autoport_cst.atomic import write_atomic
from autoport_cst.cli.common import (
    EXIT_FOUND,
    EXIT_OK,
    error_boundary,
    put_back_leftovers,
    stderr_console,
    stdout_console,
)
from autoport_cst.cli.progress import StageProgress
from autoport_cst.errors import InputError
from autoport_cst.preflight import (
    check_model_name,
    check_one_port_per_architecture,
    check_output_file,
    check_reference,
    check_source,
    default_model_name,
    require_extra,
)


@click.command("port")
@click.argument("source")
@click.option(
    "--name",
    default=None,
    help="Model name in snake_case (the package directory). Default: the checkpoint's model_type "
    "(openai-gpt -> openai_gpt).",
)
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
    "--serve",
    is_flag=True,
    help="Once it validates, serve it with real vLLM on CPU: the smoke test of `autoport-cst smoke`.",
)
@click.option(
    "--json",
    "json_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write the outcome as JSON here.",
)
@error_boundary
def port_command(source, name, out_dir, tp, ref, checkpoint, steps, seed, force, serve, json_path):
    """Port SOURCE (a checkpoint directory or hub id) end to end.

    Research the model, write the plan, apply the codemods to the closest
    reference, and validate the port on CPU against transformers (TP=1 in fp32
    and bf16, plus fp32 at --tp). Exit 0 only when every validation run is
    equivalent; 1 when the port is written and does not validate (naming the
    first diverging component, or why it cannot load the checkpoint); 2 on
    bad input (nothing written; a TP size the tensor-parallel rules refuse, a
    corrupt checkpoint) or an architecture with a feature no codemod realizes
    (named); 130 on Ctrl-C. Until the verdict the port is pending: Ctrl-C or
    an error before it keeps no port of this run and none of the tiny
    checkpoints it made (an earlier port under --out is put back as it was);
    what a run killed outright left is put back by the next port or apply
    into --out, or named with how to restore it (exit 2).
    """
    name, config = _check_input(source, name, tp, ref, checkpoint, steps, json_path)
    put_back_leftovers(out_dir)  # a port killed before its verdict (SIGKILL) left its backup
    if not force:
        check_one_port_per_architecture(out_dir, config, name, source)
    if serve:
        from autoport_cst.serve.smoke import serve_python

        serve_python()  # the serve environment, before anything runs
    from autoport_cst.port import port

    with StageProgress("port") as progress:
        try:
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
                on_stage=progress.stage,
                settle_imports=True,  # this process ends with the port
            )
        except KeyboardInterrupt:
            if progress.current not in (None, "research"):
                stderr_console().print(
                    f"interrupted before the verdict: no port of this run is kept under {out_dir} "
                    "(an earlier one is as it was); port again",
                    markup=False,
                )
            raise
    _print(outcome)
    if json_path is not None:
        write_atomic(json_path, json.dumps(outcome.to_dict(), indent=2) + "\n")
    if serve and outcome.validated and outcome.checkpoint_dir is not None:
        from autoport_cst.serve.smoke import run_smoke

        smoke = run_smoke(out_dir, outcome.checkpoint_dir, tp)
        stdout_console().print(
            f"served by vLLM on CPU: {'passed' if smoke.passed else 'FAILED'}; results in {smoke.results_file}",
            markup=False,
        )
        sys.exit(EXIT_OK if smoke.passed else EXIT_FOUND)
    sys.exit(EXIT_OK if outcome.validated else EXIT_FOUND)


def _check_input(source, name, tp, ref, checkpoint, steps, json_path) -> tuple[str, dict | None]:
    """Everything about the input that can be known before torch is imported;
    the model name (given, or derived from the checkpoint's model_type) and the
    local checkpoint's config (None for a hub id)."""
    if name is not None:
        check_model_name(name)
    if steps < 1:
        raise InputError(f"--steps must be at least 1, got {steps}")
    check_output_file(json_path, "--json")
    check_reference(ref)
    config = check_source(source, tp)
    if checkpoint == "source" and (config is None or not any(_source_dir(source).glob("*.safetensors"))):
        raise InputError(f"{source}: --checkpoint source needs a local directory with safetensors")
    require_extra("port")
    return (name if name is not None else default_model_name(config, source)), config


def _source_dir(source: str) -> Path:
    path = Path(source)
    return path if path.is_dir() else path.parent


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
    for run in outcome.runs:
        if not run.equivalent:  # why, in full: the table names only where
            console.print(f"tp={run.tp} {run.dtype}: {run.summary}", markup=False)
    from autoport_cst.port_variants import config_check_lines

    for line in config_check_lines(outcome):  # configs the plan was not made on
        console.print(line, markup=False)
    total = sum(outcome.seconds.values())
    stages = ", ".join(f"{k} {v:.1f}s" for k, v in outcome.seconds.items())
    console.print(f"total {total:.1f}s ({stages})")
    verdict = "PORTED and validated" if outcome.validated else "port written but does NOT validate"
    console.print(verdict, style="bold green" if outcome.validated else "bold red")
