"""The workflow's results file of steps 8 and 9,
``OUT/examples/vllm_neuron/models/<name>/results/results.md``: the verdict,
every check with its detail, and the figures of each run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from autoport_cst.atomic import write_atomic

FIGURE_NAMES = {
    "startup_s": "engine start-up, vLLM's imports included (s)",
    "ttft_median_s": "time to first token, median of 10 concurrent (s)",
    "latency_median_s": "request latency, median of 10 concurrent (s)",
    "tokens_per_s": "generated tokens per second, 10 concurrent",
    "load_wall_s": "wall time of the 10 concurrent requests (s)",
    "load_requests": "concurrent requests",
    "prefix_cache_hits": "prefix-cache hits (tokens)",
    "prefix_cache_queries": "prefix-cache queries (tokens)",
}


COMPARED = {
    "fp32": "every completion compared token for token with transformers' greedy generation on the "
    "same checkpoint.",
    "fp8": "every completion compared token for token with transformers' greedy generation with the "
    "port's FP8 KV cache (validate's FP8 baseline) on the same checkpoint.",
    "bf16": "the served bf16 logits judged by validate's bf16 logit gates against transformers "
    "(float32 and eager bf16) teacher-forced along the served tokens.",
}


def _cache(outcome: Any) -> str:
    return ", FP8 KV cache" if getattr(outcome, "kv_cache_dtype", "auto") == "fp8" else ""


def results_path(out_dir: Path, name: str) -> Path:
    return out_dir / "examples" / "vllm_neuron" / "models" / name / "results" / "results.md"


def _figures(figures: dict[str, Any]) -> list[str]:
    lines = []
    for run, values in figures.items():
        lines += [f"### {run}", "", "| figure | value |", "|---|---|"]
        for key, value in values.items():
            shown = f"{value:.3f}" if isinstance(value, float) and not value.is_integer() else f"{value:g}"
            lines.append(f"| {FIGURE_NAMES.get(key, key)} | {shown} |")
        lines.append("")
    return lines


def render(outcome: Any, log_dir: Path) -> str:
    verdict = "PASSED" if outcome.passed else "FAILED"
    lines = [
        f"# {outcome.name}: vLLM smoke test and server battery on CPU",
        "",
        f"{verdict}: `{outcome.architecture}` served by vLLM through the autoport-cst CPU stand-in "
        f"(TP={outcome.tp}, {outcome.dtype}{_cache(outcome)}; runs: {', '.join(outcome.runs)}); "
        + COMPARED["fp8" if _cache(outcome) else outcome.dtype],
        "",
    ]
    if outcome.failure:
        lines += [
            f"**Failed at {outcome.failure['stage']}**:",
            "",
            "```",
            outcome.failure["message"],
            "```",
            "",
        ]
    passed = sum(1 for check in outcome.checks if check["passed"])
    lines += [
        f"## Checks ({passed} of {len(outcome.checks)} passed)",
        "",
        "| check | result | detail |",
        "|---|---|---|",
    ]
    for check in outcome.checks:
        detail = check["detail"].replace("|", "\\|").replace("\n", " ")
        lines.append(f"| {check['name']} | {'pass' if check['passed'] else 'FAIL'} | {detail} |")
    lines += ["", "## Figures", "", *_figures(outcome.figures), f"Logs: `{log_dir}`", ""]
    return "\n".join(lines)


def write_results(out_dir: Path, outcome: Any, log_dir: Path) -> Path:
    path = results_path(out_dir, outcome.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, render(outcome, log_dir))
    return path
