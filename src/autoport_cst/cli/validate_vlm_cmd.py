"""``autoport-cst validate`` on a vision-language checkpoint (a config.json
with a ``text_config`` and a ``vision_config``): the port runs through
``validate_vlm`` (docs/validation.md, "Vision-language models") instead of
the text validator. It takes ``--tp``, ``--dtype``, ``--steps``, ``--seed``
and ``--json``; the text validator's other options (expert, data and
context parallelism, segmented prefill, an FP8 KV cache) are refused by
name. Exit codes as ``validate``'s: 0 equivalent, 1 not, 2 bad input.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, NoReturn

from autoport_cst.atomic import write_atomic
from autoport_cst.cli.common import stdout_console
from autoport_cst.errors import InputError
from autoport_cst.preflight import check_tp

# the text validator's options a vision-language run does not take, at their defaults
PLAIN_VALUES = (1, "auto", False)


def _check_inputs(config: dict, config_path: Path, tp: int, others: dict[str, Any]) -> None:
    changed = sorted(name for name, value in others.items() if value not in PLAIN_VALUES)
    if changed:
        options = ", ".join("--" + name.replace("_", "-") for name in changed)
        raise InputError(f"{options}: not supported for a vision-language checkpoint (validate_vlm)")
    check_tp(config["text_config"], tp, config_path)
    heads = config["vision_config"].get("num_heads")
    if isinstance(heads, int) and heads % tp:
        raise InputError(f"--tp {tp}: the vision tower's {heads} heads are not divisible by {tp}")


def validate_vision_language(
    model_dir: Path,
    checkpoint_dir: Path,
    config: dict,
    *,
    tp: int,
    dtype: str,
    steps: int,
    seed: int,
    json_path: Path | None,
    others: dict[str, Any],
) -> NoReturn:
    _check_inputs(config, checkpoint_dir / "config.json", tp, others)
    from autoport_cst.validate.vision_validate import validate_vlm

    report = validate_vlm(model_dir, checkpoint_dir, dtype=dtype, steps=steps, seed=seed, tp=tp)
    if json_path is not None:
        write_atomic(json_path, json.dumps(report.to_json(), indent=2, default=str) + "\n")
    _print(report)
    sys.exit(0 if report.equivalent else 1)


def tiny_vision_language(architecture: str, outdir: Path, seed: int, dimensions: dict[str, int]) -> bool:
    """``autoport-cst tiny`` for a transformers vision-language class: the
    tiny checkpoint of ``vision_tiny`` (fixed sizes: ``--set`` is refused;
    no tokenizer is written). False for any other architecture."""
    import transformers

    config_class = getattr(getattr(transformers, architecture, None), "config_class", None)
    if "vision_config" not in getattr(config_class, "sub_configs", {}):
        return False
    if dimensions:
        raise InputError(f"--set: not supported for the vision-language architecture {architecture}")
    from autoport_cst.validate.vision_tiny import build_tiny_vlm_checkpoint

    directory = build_tiny_vlm_checkpoint(outdir, seed=seed, architecture=architecture)
    stdout_console().print(
        f"wrote {directory}/config.json and model.safetensors: {architecture}, "
        f"a tiny text decoder and vision tower (validate_vlm's prompts need no tokenizer), seed {seed}"
    )
    return True


def _print(report: Any) -> None:
    from rich.table import Table

    console = stdout_console()
    table = Table(
        title=f"vision-language validation: TP={report.tp} {report.dtype}, {report.steps} decode steps"
    )
    for column in ("prompt", "check", "rows", "rel. error", "R-ratio", "passed"):
        table.add_column(column)
    for check in report.checks:
        table.add_row(
            check["prompt"],
            check["name"],
            str(check.get("rows") or ""),
            _num(check.get("rel_error")),
            _num(check.get("r_ratio")),
            "yes" if check["passed"] else "NO" + (f" ({check['note']})" if check.get("note") else ""),
        )
    console.print(table)
    if report.failure:
        console.print(f"the port failed at {report.failure_stage}: {report.failure}")
    if report.equivalent:
        verdict = "equivalent"
    elif report.failure_stage == "lint":  # validate.lint_gate: not run
        verdict = "DOES NOT VALIDATE (it breaks a Trainium hardware rule; the port was not run)"
    elif report.failure:
        verdict = f"NOT equivalent (the port failed at {report.failure_stage})"
    else:
        verdict = f"NOT equivalent (first diverging: {report.first_diverging})"
    console.print(verdict)


def _num(value: Any) -> str:
    return "" if value is None else f"{value:.3g}"
