"""The guards a default validation drives: what the port must refuse, or get right.

A reference declares some input unsupported by a guard that raises
``NotImplementedError`` before the kernels see it: segmented (chunked or
prefix-cached) prefill reads an FP8 KV cache only in the packed layout, so a
port with cache paths calls ``validate_fp8_segmented_supported`` before the
segmented kernel. The plain run keeps a ``float32`` cache and the FP8 run turns
the cache paths off, so neither reaches that guard, and a port that drops or
weakens it validates, then sends a non-packed FP8 cache to a kernel that cannot
read it (on the device: no error, a wrong attention).

So a passing plain validation of a port that has cache paths (it reads
``kv_segment_size``, and its plain run took them) and an FP8 cache (it reads ``k_scale``) goes on to an FP8
KV-cache run with segmented prefill forced, on the same checkpoint: it passes
when the port refuses by a guard (its own ``NotImplementedError``, or the API's
guard it calls) or validates (a port that packs its FP8 cache); a port that
crashes otherwise or diverges fails. Its entry is one of ``report.config_variants``.

A port without the guard breaks the lint rule NRN009 and fails before it runs
(``lint_gate``; the real qwen3 package of vllm_neuron has no guard, and is
reported so). One that still reaches the segmented kernel with the non-packed
cache (its guard weakened to ``fp8_packed=True``, which the rule does not
judge, or ``validate_model(..., lint=False)``) is refused by the kernel itself:
on the device its K load asserts (the API's guard exists to fail fast with a
clear message instead of that kernel abort). No wrong attention is computed,
so that run passes too, with a warning that names the missing guard in its
entry's summary.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

LABEL = "kv_cache_dtype=fp8 with segmented prefill (the port's guard refuses it, or it validates)"
KERNEL_ONLY = (
    "the port sends a non-packed FP8 KV cache to the segmented kernel, which asserts on the device; "
    "call validate_fp8_segmented_supported before it for a clear message"
)


def _reads(package_dir: str | Path, name: str) -> bool:
    return any(name in path.read_text(encoding="utf-8") for path in Path(package_dir).glob("*.py"))


def has_fp8_cache_paths(package_dir: str | Path) -> bool:
    """Whether the port has cache paths (``kv_segment_size``) and an FP8 cache (``k_scale``)."""
    return _reads(package_dir, "kv_segment_size") and _reads(package_dir, "k_scale")


def took_cache_paths(report: Any) -> bool:
    """Whether the plain run took the cache paths (the driver's decision: the port reads
    ``kv_segment_size`` from the metadata). A port that names it but never reads it (a copy
    without segmented prefill) is not asked about a path it does not have."""
    calls = getattr(report, "settings", {}).get("prefill_calls", [])
    return any(call.get("kind") != "whole" for call in calls)


def check_fp8_segmented_guard(report: Any, package_dir: str | Path, validate: Callable[..., Any]) -> None:
    """Run the port with an FP8 KV cache and segmented prefill
    (``validate(kv_cache_dtype="fp8", prefill="segmented") -> ValidationReport``)
    into ``report.config_variants``; anything but a guard's refusal or an
    equivalent run fails ``report``, named after it."""
    from autoport_cst.errors import InputError

    from .standin.prefill_attention import NON_PACKED_FP8

    if not report.equivalent or not has_fp8_cache_paths(package_dir) or not took_cache_paths(report):
        return
    entry: dict[str, Any] = {"label": LABEL, "equivalent": None, "summary": None}
    report.config_variants.append(entry)
    try:
        found = validate(kv_cache_dtype="fp8", prefill="segmented")
    except InputError as refused:  # the validator cannot run an FP8 cache on this checkpoint
        entry["summary"] = f"not run: {str(refused).strip().splitlines()[0]}"
        return
    if found.failure is not None and found.failure.refusal:
        entry.update(equivalent=True, summary=f"refused ({found.failure.stage}: {found.failure.message})")
        return
    if found.failure is not None and NON_PACKED_FP8 in found.failure.message:
        entry.update(equivalent=True, summary=f"refused by the kernel, not by a guard: {KERNEL_ONLY}")
        return
    entry.update(equivalent=found.equivalent, summary=found.summary())
    if not found.equivalent and report.equivalent:
        report.fail_as(f"guard {LABEL}", found)
