"""The smoke test's checks. On random weights "coherent text" means
nothing, so every check is an equality: served greedy tokens equal
transformers' greedy tokens; a batch equals its prompts one by one; the
streamed chunks concatenate to the non-streamed text; a run with prefix
caching equals the run without; vLLM's metrics count prefix-cache hits."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from .battery import BatteryRun, Completion


@dataclass
class Check:
    name: str
    passed: bool
    detail: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _difference(got: list[int], want: list[int]) -> str:
    for i, (a, b) in enumerate(zip(got, want, strict=False)):
        if a != b:
            return f"token {i}: served {a}, expected {b} (served {got}, expected {want})"
    return f"served {len(got)} tokens, expected {len(want)}"


def greedy_checks(label: str, completions: list[Completion], reference: Any) -> list[Check]:
    checks = []
    for completion in completions:
        want = reference.tokens(completion.prompt_token_ids, len(completion.token_ids))
        same = completion.token_ids == want and bool(want)
        detail = "" if same else _difference(completion.token_ids, want)
        checks.append(Check(f"{label}: {completion.name} equals transformers greedy", same, detail))
    return checks


def batch_check(label: str, run: BatteryRun) -> Check:
    singles = run.by_name()
    wrong = [
        f"{item.name}: {item.token_ids} vs one by one {singles[f'single[{i}]'].token_ids}"
        for i, item in enumerate(run.batch)
        if item.token_ids != singles[f"single[{i}]"].token_ids
    ]
    return Check(
        f"{label}: a batch of four equals its prompts one by one",
        not wrong and len(run.batch) == 4,
        "; ".join(wrong),
    )


def stream_check(label: str, run: BatteryRun) -> Check:
    plain = run.by_name()["stream (not streamed)"]
    same = run.streamed_text == plain.text and run.streamed_token_ids == plain.token_ids
    detail = "" if same else f"streamed {run.streamed_text!r}, not streamed {plain.text!r}"
    return Check(f"{label}: streamed chunks concatenate to the non-streamed text", same, detail)


def same_runs(first: BatteryRun, second: BatteryRun) -> Check:
    a, b = first.by_name(), second.by_name()
    wrong = [name for name in a if name not in b or a[name].token_ids != b[name].token_ids]
    return Check("prefix caching on equals off (every completion)", not wrong, ", ".join(wrong))


def cache_hit_check(hits: float, queries: float) -> Check:
    return Check(
        "vLLM's metrics count prefix-cache hits (caching on)",
        hits > 0,
        f"prefix_cache_hits {hits:.0f} of {queries:.0f} queried tokens",
    )


def kv_cache_kind_check(layout: list[dict[str, Any]]) -> Check:
    """Every layer the port declares with a sliding window is held by vLLM's
    KV-cache manager as a sliding-window spec of that window, every other
    layer as full attention."""
    wrong = [
        f"{entry['layer']}: port window {entry['port_window']}, vLLM {entry['vllm_spec']} "
        f"(window {entry['vllm_window']})"
        for entry in layout
        if (entry["vllm_spec"] == "SlidingWindowSpec") != bool(entry["port_window"])
        or (entry["port_window"] and entry["vllm_window"] != entry["port_window"])
    ]
    windows = sorted({entry["port_window"] for entry in layout if entry["port_window"]})
    detail = "; ".join(wrong) or (
        f"{sum(1 for e in layout if e['port_window'])} sliding-window layer(s) (window {windows}), "
        f"{sum(1 for e in layout if not e['port_window'])} full-attention layer(s)"
    )
    return Check(
        "vLLM's KV-cache manager holds each layer as the port declares it", not wrong and bool(layout), detail
    )


def kv_cache_dtype_check(layout: list[dict[str, Any]], expected: str) -> Check:
    """Every layer's cache is ``expected`` in vLLM's spec and as bound."""
    wrong = [
        f"{entry['layer']}: vLLM {entry['vllm_dtype']}, bound {entry['bound_dtype']}"
        for entry in layout
        if entry["vllm_dtype"] != expected or entry["bound_dtype"] != expected
    ]
    return Check(
        f"every layer's KV cache is {expected} (vLLM's spec and the cache bound to the port)",
        not wrong and bool(layout),
        "; ".join(wrong),
    )
