"""``autoport-cst smoke``: workflow steps 8 and 9 on CPU, from the project's
own environment.

vLLM pins a transformers older than the project's, so it lives in an
environment of its own (README: serving). This module runs without vLLM:
it checks the input (the port tree's registry, the checkpoint, the exact
architecture string, the TP size) before anything starts, runs
``smoke_child`` with the serve environment's Python, and writes the
workflow's results file ``OUT/examples/vllm_neuron/models/<name>/results/
results.md``.

The serve environment's Python: ``AUTOPORT_SERVE_PYTHON``, else this
interpreter when it can import vLLM, else ``.venv-serve/bin/python`` in the
working directory or the project checkout.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from autoport_cst.errors import InputError

from .port_tree import match_architecture, registry_architectures, registry_packages, registry_path
from .smoke_child import RUNS, SmokeSettings

SERVE_PYTHON_VARIABLE = "AUTOPORT_SERVE_PYTHON"
DTYPES = {"fp32": "float32", "bf16": "bfloat16"}
KV_CACHE_DTYPES = ("auto", "fp8")
SERVE_VENV = ".venv-serve"
CHECKOUT = Path(__file__).resolve().parents[3]


@dataclass
class SmokeOutcome:
    name: str
    architecture: str
    tp: int
    runs: list[str]
    checks: list[dict[str, Any]] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)
    failure: dict[str, str] | None = None
    results_file: str = ""
    dtype: str = "fp32"
    kv_cache_dtype: str = "auto"

    @property
    def passed(self) -> bool:
        return self.failure is None and bool(self.checks) and all(c["passed"] for c in self.checks)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "passed": self.passed}


def serve_python() -> Path:
    """The serve environment's interpreter (see the module docstring)."""
    named = os.environ.get(SERVE_PYTHON_VARIABLE)
    if named:
        if not Path(named).is_file():
            raise InputError(f"{SERVE_PYTHON_VARIABLE}={named}: no such file")
        return Path(named)
    if importlib.util.find_spec("vllm") is not None:
        import sys

        return Path(sys.executable)
    for root in (Path.cwd(), CHECKOUT):
        candidate = root / SERVE_VENV / "bin" / "python"
        if candidate.is_file():
            return candidate
    raise InputError(
        f"no serve environment: vLLM is not installed here, there is no {SERVE_VENV}/ (its one-line "
        f"set-up: docs/serving.md) and {SERVE_PYTHON_VARIABLE} is not set"
    )


def check_smoke_input(
    out_dir: Path,
    checkpoint: Path,
    tp: int,
    runs: list[str],
    dtype: str = "fp32",
    kv_cache_dtype: str = "auto",
) -> tuple[str, str]:
    """(architecture, port name), or InputError: nothing runs on bad input."""
    from autoport_cst.preflight import check_checkpoint_dir

    unknown = sorted(set(runs) - set(RUNS))
    if unknown or not runs:
        raise InputError(f"--runs: {', '.join(unknown) or 'none given'}; choose from {', '.join(RUNS)}")
    if dtype not in DTYPES:
        raise InputError(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if dtype == "bf16" and runs != ["offline"]:
        raise InputError(
            f"--dtype bf16 serves the offline run only (--runs offline), not {', '.join(runs)}: the server "
            "battery's checks are exact (a batch equals its prompts one by one, prefix caching on equals "
            "off), which bf16 rounding legitimately breaks"
        )
    check_kv_cache_dtype(kv_cache_dtype, runs, dtype)
    if not registry_path(out_dir).is_file():
        raise InputError(f"{out_dir}: no {registry_path('.')} (is it a directory apply wrote?)")
    config = check_checkpoint_dir(checkpoint, tp)
    architectures = config.get("architectures") or []
    if not architectures or not isinstance(architectures[0], str):
        raise InputError(f"{checkpoint / 'config.json'}: no architectures[0]")
    architecture = match_architecture(
        architectures[0], registry_architectures(out_dir), registry_path(out_dir)
    )
    return architecture, registry_packages(out_dir).get(architecture, architecture)


def check_kv_cache_dtype(kv_cache_dtype: str, runs: list[str], dtype: str) -> None:
    """FP8 serves the offline run in fp32 only: its prompts are prefilled
    whole and without prefix caching (a chunk after cached tokens is a
    segmented prefill, which reads only a packed FP8 cache: ``limits``)."""
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise InputError(
            f"--kv-cache-dtype must be one of {', '.join(KV_CACHE_DTYPES)}, got {kv_cache_dtype!r}"
        )
    if kv_cache_dtype == "fp8" and (runs != ["offline"] or dtype != "fp32"):
        raise InputError(
            "--kv-cache-dtype fp8 serves the offline run in fp32 (--runs offline --dtype fp32): the server "
            "battery's prefix-cache hits and chunked prompts take segmented prefill, which reads only a "
            "packed FP8 cache, and the FP8 baseline is compared in fp32"
        )


def _stop(process: subprocess.Popen) -> None:
    """SIGTERM (the child stops its server), then SIGKILL, to its session."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(60)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)


def run_child(python: Path, settings: SmokeSettings, log: Path) -> int:
    settings_file = Path(settings.workdir) / "settings.json"
    settings_file.write_text(json.dumps(asdict(settings)))
    command = [str(python), "-m", "autoport_cst.serve.smoke_child", str(settings_file)]
    with log.open("w") as handle:
        process = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            return process.wait()
        except BaseException:
            _stop(process)
            raise


def _tail(log: Path, lines: int = 20) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    return ""


def run_smoke(
    out_dir: Path,
    checkpoint: Path,
    tp: int = 1,
    runs: list[str] | None = None,
    workdir: Path | None = None,
    dtype: str = "fp32",
    kv_cache_dtype: str = "auto",
) -> SmokeOutcome:
    """Check the input, run the smoke test, write the results file."""
    from .results import write_results

    offline_only = dtype == "bf16" or kv_cache_dtype == "fp8"
    runs = list(runs) if runs is not None else (["offline"] if offline_only else list(RUNS))
    architecture, name = check_smoke_input(out_dir, checkpoint, tp, runs, dtype, kv_cache_dtype)
    python = serve_python()
    work = Path(workdir or tempfile.mkdtemp(prefix="autoport-smoke-"))
    work.mkdir(parents=True, exist_ok=True)
    settings = SmokeSettings(
        out_dir=str(out_dir.resolve()),
        checkpoint=str(checkpoint.resolve()),
        result=str(work / "result.json"),
        workdir=str(work),
        tp=tp,
        runs=runs,
        dtype=DTYPES[dtype],
        kv_cache_dtype=kv_cache_dtype,
    )
    code = run_child(python, settings, work / "smoke.log")
    outcome = SmokeOutcome(name, architecture, tp, runs, dtype=dtype, kv_cache_dtype=kv_cache_dtype)
    result_path = Path(settings.result)
    if result_path.is_file():
        result = json.loads(result_path.read_text())
        outcome.checks, outcome.figures, outcome.failure = (
            result["checks"],
            result["figures"],
            result["failure"],
        )
    else:
        outcome.failure = {
            "stage": "smoke",
            "message": f"exited with code {code}; its log ends:\n{_tail(work / 'smoke.log')}",
        }
    if outcome.failure and outcome.failure["stage"] == "input":
        raise InputError(outcome.failure["message"])  # found before anything was served: nothing written
    outcome.results_file = str(write_results(out_dir, outcome, work))
    return outcome
