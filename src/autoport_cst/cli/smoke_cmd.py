"""``autoport-cst smoke``: workflow steps 8 and 9 (vLLM's offline API and
its OpenAI server) on CPU, through the serving plugin (autoport_cst.serve).

Exit codes: 0 every check passed, 1 the port was served and a check failed
or the port failed inside vLLM (the server did not come up, a request
failed), 2 bad input (checked before anything starts: the port tree, the
checkpoint, the exact architecture string, the TP size, the serve
environment), 130 interrupted (the server and its engine are stopped).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from autoport_cst.cli.common import EXIT_FOUND, error_boundary, stdout_console


@click.command("smoke")
@click.argument("out_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "--hf", "checkpoint", required=True, type=click.Path(path_type=Path), help="Checkpoint directory."
)
@click.option("--tp", type=int, default=1, show_default=True, help="Tensor-parallel size (CPU ranks).")
@click.option(
    "--runs",
    default=None,
    help="Comma-separated runs: offline (step 8), server and server-prefix-caching (step 9); "
    "default all three (fp32), offline (bf16).",
)
@click.option(
    "--dtype",
    default="fp32",
    show_default=True,
    help="fp32 (exact greedy tokens) or bf16 (the offline run, judged by validate's bf16 logit gates).",
)
@click.option(
    "--kv-cache-dtype",
    default="auto",
    show_default=True,
    help="auto or fp8 (the offline run in fp32, against validate's FP8 KV-cache baseline).",
)
@click.option(
    "--workdir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Where logs go (a temporary directory).",
)
@click.option("--json", "json_output", is_flag=True, help="Print the outcome as JSON.")
@error_boundary
def smoke_command(
    out_dir: Path,
    checkpoint: Path,
    tp: int,
    runs: str | None,
    dtype: str,
    kv_cache_dtype: str,
    workdir: Path | None,
    json_output: bool,
) -> None:
    """Serve the port under OUT_DIR (a directory apply wrote) with real vLLM
    on CPU and check it against transformers on the checkpoint --hf."""
    from autoport_cst.serve.smoke import run_smoke

    chosen = [run for run in runs.split(",") if run] if runs is not None else None
    outcome = run_smoke(out_dir, checkpoint, tp, chosen, workdir, dtype, kv_cache_dtype)
    console = stdout_console()
    if json_output:
        click.echo(json.dumps(outcome.to_json(), indent=2, default=str))
    else:
        passed = sum(1 for check in outcome.checks if check["passed"])
        for check in outcome.checks:
            if not check["passed"]:
                console.print(f"FAIL {check['name']}: {check['detail']}")
        if outcome.failure:
            console.print(f"failed at {outcome.failure['stage']}: {outcome.failure['message']}")
        verdict = "passed" if outcome.passed else "FAILED"
        console.print(
            f"smoke {verdict}: {passed} of {len(outcome.checks)} checks; results in {outcome.results_file}"
        )
    if not outcome.passed:
        sys.exit(EXIT_FOUND)
