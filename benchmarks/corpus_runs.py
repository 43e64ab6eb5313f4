"""One row of the corpus: a tiny random checkpoint of a model type, its port,
and the port's validation, as ``corpus.py`` runs them.

``runs="table"`` (the default of ``corpus.py``): ``port``'s research,
reference choice and codemods (its own functions, on the same inputs), then
the runs the table reports, each as ``port`` runs it: TP=1 in fp32, TP=1 in
bf16 and TP=2 in fp32, prefill and 16 decode steps. ``port`` follows a
passing TP=1 fp32 run with an FP8 KV-cache run (``kv_scale_variant``); the
table does not report it and these runs leave it out: it was the costliest
of a row's runs (2 to 3.5 s of CPU against 1.3 to 1.9 s for the TP=1 fp32
run with its transformers run), a quarter of a ported row.

``runs="full"``: ``port`` exactly as ``autoport-cst port --tp 2 --force``
runs it, adding the checks the table does not report: the FP8 KV-cache
follow-up, the reference's declared config variants, the attention, MLP and
embedding data-parallel layouts, a second random checkpoint varying every
field the port reads at run time (with its own follow-ups) and the config
guards.
"""

from __future__ import annotations

import sys
import time
import traceback
from pathlib import Path

from corpus_table import refusal_detail

RUNS = ("table", "full")
STEPS = 16
SEED = 0


def new_row(model_type: str, architecture: str) -> dict:
    return {
        "model_type": model_type,
        "architecture": architecture,
        "reference": None,
        "steps": [],
        "verdict": "",
        "detail": "",
        "max_error": None,
        "seconds": 0.0,
        "cpu_seconds": 0.0,
        "blocked": [],
    }


def cpu_seconds() -> float:
    """The CPU time of this process and of the children it has waited for
    (a validation's forked ranks)."""
    import resource

    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def full_size_refusal(architecture: str, directory: Path) -> list[str]:
    """The features that refuse ``architecture``, researched from its
    transformers default config alone, when no tiny checkpoint can be built;
    empty when the research does not refuse it (or cannot run)."""
    return full_size_refusal_error(architecture, directory)[0]


def full_size_refusal_error(architecture: str, directory: Path) -> tuple[list[str], str]:
    """``full_size_refusal``'s features and the refusal's text."""
    from autoport_cst.port import refusal
    from autoport_cst.research import choose_reference, research
    from autoport_cst.validate.tiny import resolve_config, write_config_json

    try:
        config, _ = resolve_config(architecture)
        config.architectures = [architecture]
        directory.mkdir(parents=True, exist_ok=True)
        write_config_json(config, directory / "config.json")
        found = research(str(directory))
        error = refusal(found, choose_reference(found.spec, "full_size", found.architecture, None))
    except Exception:  # noqa: BLE001 - the row keeps its tiny-checkpoint error
        return [], ""
    return (list(error.features), str(error)) if error is not None else ([], "")


def run_one(model_type: str, architecture: str, work: Path, tp2: bool, runs: str = "table") -> dict:
    """The row of ``model_type``, its files under ``work``."""
    from autoport_cst.validate import build_tiny_checkpoint

    row = new_row(model_type, architecture)
    start, cpu = time.perf_counter(), cpu_seconds()
    source = work / f"{model_type}-src"
    try:
        build_tiny_checkpoint(architecture, source, seed=SEED)
    except Exception as error:  # noqa: BLE001
        row.update(verdict="no tiny checkpoint", detail=f"{type(error).__name__}: {error}"[:160])
        features, message = full_size_refusal_error(architecture, work / f"{model_type}-full")
        if features:
            # refused by research on the full-size config (no weights needed)
            row.update(
                verdict="refused",
                blocked=features,
                detail=refusal_detail(features, message, full_size=True),
            )
    else:
        _port_row(row, source, work / "out", tp2, runs)
    row["seconds"] = time.perf_counter() - start
    row["cpu_seconds"] = cpu_seconds() - cpu
    return row


def _port_row(row: dict, source: Path, out: Path, tp2: bool, runs: str) -> None:
    from autoport_cst.errors import AutoportError, UnrealizableDiffError

    name = "port_" + "".join(c if c.isalnum() else "_" for c in row["model_type"].lower())
    try:
        outcome = _port(source, name, out, tp2, runs)
        _judge(row, outcome)
    except UnrealizableDiffError as error:
        row.update(
            verdict="refused",
            blocked=list(error.features),
            detail=refusal_detail(list(error.features), str(error)),
        )
    except AutoportError as error:
        row.update(verdict="error", detail=str(error).splitlines()[0][:200])
    except Exception as error:  # noqa: BLE001
        row.update(verdict="crash", detail=f"{type(error).__name__}: {error}"[:200])
        traceback.print_exc(file=sys.stderr)


def _port(source: Path, name: str, out: Path, tp2: bool, runs: str):
    if runs == "full":
        from autoport_cst.port import port

        return port(str(source), name, out, tp=2 if tp2 else 1, force=True)
    return port_table_runs(source, name, out, tp2)


def _judge(row: dict, outcome) -> None:
    """The verdict of a port from its runs (and, in a full run, its checks
    beyond the planned config)."""
    row.update(reference=outcome.reference, steps=outcome.steps)
    errors = [r.max_abs_error for r in outcome.runs if r.dtype == "fp32" and r.max_abs_error is not None]
    row["max_error"] = max(errors) if errors else None
    if outcome.validated:
        row["verdict"] = "ported"
        return
    bad = [r for r in outcome.runs if not r.equivalent]
    details = [f"tp{r.tp} {r.dtype}: {r.first_diverging}" for r in bad]
    # beyond the planned config (autoport_cst.port_variants)
    details += [f"config variant: {r.first_diverging}" for r in outcome.variant_runs if not r.equivalent]
    details += [f"config guard {g.field}: not refused by name" for g in outcome.guards if not g.refused]
    row.update(verdict="does not validate", detail="; ".join(details))


def port_table_runs(source: Path, name: str, out: Path, tp2: bool):
    """``port``'s research, reference choice, codemods and validation
    checkpoint, then the table's runs (the module): a ``PortOutcome``."""
    from autoport_cst import port as port_module
    from autoport_cst.validate.reference_reuse import reusing_reference_runs

    found, choice = port_module._research(str(source), name, None)
    outcome = port_module.PortOutcome(name, found.architecture, unknown=list(found.unknown), seed=SEED)
    port_module._apply(outcome, found, choice, str(source), out, None, True)
    outcome.checkpoint_dir = port_module.port_checkpoint(outcome, found, out, "tiny")
    port_module._check_validation_tp(outcome, 2 if tp2 else 1)
    with reusing_reference_runs():
        for tp, dtype in [(1, "fp32"), (1, "bf16")] + ([(2, "fp32")] if tp2 else []):
            run = _table_run(outcome, tp, dtype)
            outcome.runs.append(run)
            if run.first_diverging and run.first_diverging.startswith("load: "):
                break  # a checkpoint the port cannot load ends the runs, as in port
    return outcome


def _table_run(outcome, tp: int, dtype: str):
    """One of the table's runs, as ``port`` runs it (without the FP8
    KV-cache follow-up of a passing TP=1 fp32 run: see the module)."""
    from autoport_cst.errors import InputError
    from autoport_cst.validate import validate_model
    from autoport_cst.validation_runs import ValidationRun, first_diverging, max_abs

    start = time.perf_counter()
    package, checkpoint = outcome.package_dir, outcome.checkpoint_dir
    options = {"steps": STEPS, "config_variants": False, "parallel_layouts": False}
    try:
        report = validate_model(package, checkpoint, tp=tp, dtype=dtype, seed=SEED, **options)
    except InputError as error:  # a checkpoint made from the model's own config: the port's fault
        return ValidationRun(
            tp, dtype, False, str(error), f"load: {error}", None, time.perf_counter() - start
        )
    return ValidationRun(
        tp=tp,
        dtype=dtype,
        equivalent=report.equivalent,
        summary=report.summary(),
        first_diverging=first_diverging(report),
        max_abs_error=max_abs(report),
        seconds=time.perf_counter() - start,
    )
