"""The workflow's request battery against a running OpenAI API server, and
its figures.

Requests, all greedy (temperature 0) and with ``ignore_eos`` so that each
gives exactly ``max_tokens`` tokens (a random model samples its EOS token
as readily as any other):

- ``basic``: one completion;
- ``batch``: four prompts in one request, and the same four one by one;
- ``stream``: a streamed completion, and the same request not streamed;
- ``counting``: the counting continuation ``1, 2, 3, 4, 5,``;
- ``prefix``: three prompts sharing a long prefix (several cache blocks),
  one after another, so that a prefix cache has something to hit;
- ``load``: ten requests at once, streamed: time to first token, latency
  and tokens per second.

Every completion keeps its prompt and completion token ids
(``return_token_ids``), for the checks of ``smoke_checks``.
"""

from __future__ import annotations

import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from .server import Server, post, post_stream

BASIC = "The capital of France is"
BATCH = ["Once upon a time there was", "def fibonacci(n):", "The quick brown fox", "A serving engine"]
STREAM = "for i in range(10):"
COUNTING = "1, 2, 3, 4, 5,"
SHARED_PREFIX = (
    "A serving engine schedules the requests, fills the cache block by block and samples one token "
    "at a time. The quick brown fox jumps over the lazy dog. Once upon a time there was a little "
    "model that counted the tokens of every prompt it read, then wrote the next one. "
)
PREFIX_SUFFIXES = ["Question one:", "Question two:", "Question three:"]
LOAD_REQUESTS = 10


@dataclass
class Completion:
    name: str
    prompt: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str


@dataclass
class BatteryRun:
    completions: list[Completion] = field(default_factory=list)
    batch: list[Completion] = field(default_factory=list)
    streamed_text: str = ""
    streamed_token_ids: list[int] = field(default_factory=list)
    figures: dict[str, float] = field(default_factory=dict)

    def by_name(self) -> dict[str, Completion]:
        return {completion.name: completion for completion in self.completions}


def _body(model: str, prompt: Any, max_tokens: int) -> dict[str, Any]:
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "return_token_ids": True,
    }


def _completion(name: str, prompt: str, choice: dict[str, Any], prompt_ids: list[int] | None) -> Completion:
    return Completion(
        name,
        prompt,
        list(prompt_ids if prompt_ids is not None else choice.get("prompt_token_ids") or []),
        list(choice.get("token_ids") or []),
        choice.get("text", ""),
    )


def complete(server: Server, model: str, name: str, prompt: str, max_tokens: int) -> Completion:
    response = post(server, "/v1/completions", _body(model, prompt, max_tokens))
    choice = response["choices"][0]
    return _completion(name, prompt, choice, choice.get("prompt_token_ids"))


def _batch(server: Server, model: str, max_tokens: int) -> list[Completion]:
    response = post(server, "/v1/completions", _body(model, BATCH, max_tokens))
    choices = sorted(response["choices"], key=lambda choice: choice["index"])
    return [
        _completion(f"batch[{i}]", prompt, choice, choice.get("prompt_token_ids"))
        for i, (prompt, choice) in enumerate(zip(BATCH, choices, strict=True))
    ]


def _stream(server: Server, model: str, max_tokens: int, run: BatteryRun) -> None:
    events = post_stream(server, "/v1/completions", _body(model, STREAM, max_tokens))
    for event in events:
        for choice in event.get("choices", []):
            run.streamed_text += choice.get("text") or ""
            run.streamed_token_ids += choice.get("token_ids") or []


def load_prompts() -> list[str]:
    return [f"{BATCH[i % len(BATCH)]} {i}" for i in range(LOAD_REQUESTS)]


def server_prompts(max_tokens: int) -> list[tuple[str, int]]:
    """Every prompt the battery sends, with the tokens it asks for."""
    prompts = [BASIC, *BATCH, STREAM, COUNTING] + [SHARED_PREFIX + suffix for suffix in PREFIX_SUFFIXES]
    return [(prompt, max_tokens) for prompt in prompts] + [
        (prompt, 2 * max_tokens) for prompt in load_prompts()
    ]


def _load(server: Server, model: str, max_tokens: int) -> dict[str, float]:
    prompts = load_prompts()

    def one(prompt: str) -> tuple[float, float, int]:
        events = post_stream(server, "/v1/completions", _body(model, prompt, max_tokens))
        timed = [event for event in events if any(c.get("text") for c in event.get("choices", []))]
        tokens = sum(len(c.get("token_ids") or []) for event in events for c in event.get("choices", []))
        return (
            timed[0]["_t"] if timed else float("nan"),
            events[-1]["_t"] if events else float("nan"),
            tokens,
        )

    start = time.perf_counter()
    with ThreadPoolExecutor(LOAD_REQUESTS) as pool:
        results = list(pool.map(one, prompts))
    wall = time.perf_counter() - start
    first, latency, tokens = zip(*results, strict=True)
    return {
        "load_requests": float(LOAD_REQUESTS),
        "ttft_median_s": statistics.median(first),
        "latency_median_s": statistics.median(latency),
        "tokens_per_s": sum(tokens) / wall,
        "load_wall_s": wall,
    }


def run_battery(server: Server, model: str, max_tokens: int = 16) -> BatteryRun:
    run = BatteryRun()
    run.completions.append(complete(server, model, "basic", BASIC, max_tokens))
    run.completions += [complete(server, model, f"single[{i}]", p, max_tokens) for i, p in enumerate(BATCH)]
    run.batch = _batch(server, model, max_tokens)
    run.completions.append(complete(server, model, "stream (not streamed)", STREAM, max_tokens))
    _stream(server, model, max_tokens, run)
    run.completions.append(complete(server, model, "counting", COUNTING, max_tokens))
    for i, suffix in enumerate(PREFIX_SUFFIXES):
        run.completions.append(complete(server, model, f"prefix[{i}]", SHARED_PREFIX + suffix, max_tokens))
    run.figures = _load(server, model, 2 * max_tokens)
    return run
