"""The smoke test itself, run in the serve environment (vLLM and the
transformers it pins): ``python -m autoport_cst.serve.smoke_child SETTINGS``
with SETTINGS a JSON file (``SmokeSettings``); it writes the outcome as JSON
to ``settings.result``.

Runs, each optional:

- ``offline`` (workflow step 8): ``LLM.generate`` on the battery's prompts;
- ``server`` (step 9): the OpenAI server without prefix caching, the battery;
- ``server-prefix-caching``: the server restarted with
  ``--enable-prefix-caching``, the battery again, and vLLM's prefix-cache
  counters from ``/metrics``.

Every completion is checked against transformers' greedy generation on the
same checkpoint (``reference``), in float32. In bfloat16 (``dtype``; the
offline run only) the served raw logits are judged by the validator's bf16
logit gates instead (``bf16_checks``). The offline run also checks that
vLLM's KV-cache manager holds each layer as the port declares it (sliding
window or full attention).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autoport_cst.errors import InputError

from .battery import BASIC, BATCH, COUNTING, BatteryRun, Completion, run_battery, server_prompts
from .checks import (
    Check,
    batch_check,
    cache_hit_check,
    greedy_checks,
    kv_cache_dtype_check,
    kv_cache_kind_check,
    same_runs,
    stream_check,
)
from .server import ServerError, metrics, running_server

RUNS = ("offline", "server", "server-prefix-caching")
KV_CACHE_BYTES = 64 << 20


@dataclass
class SmokeSettings:
    out_dir: str
    checkpoint: str
    result: str
    workdir: str
    tp: int = 1
    runs: list[str] = field(default_factory=lambda: list(RUNS))
    max_tokens: int = 16
    block_size: int = 32
    max_num_batched_tokens: int = 64
    server_timeout: float = 900.0
    dtype: str = "float32"  # or "bfloat16" (the offline run only)
    kv_cache_dtype: str = "auto"  # or "fp8" (the offline run in float32 only)


@dataclass
class OfflineRun:
    completions: list[Completion]
    startup: float
    kv_cache_layout: list[dict[str, Any]]
    logits: list[Any]  # per completion, its served raw logits [n, vocab] (bfloat16 runs)


def engine_options(settings: SmokeSettings, max_model_len: int) -> dict[str, Any]:
    if settings.kv_cache_dtype == "fp8":  # every prompt prefilled whole (limits.check_cache_dtype)
        return {
            **_options(settings, max_model_len),
            "kv_cache_dtype": "fp8",
            "max_num_batched_tokens": max_model_len,
        }
    return _options(settings, max_model_len)


def _options(settings: SmokeSettings, max_model_len: int) -> dict[str, Any]:
    return {
        "tensor_parallel_size": settings.tp,
        "dtype": settings.dtype,
        "block_size": settings.block_size,
        "max_model_len": max_model_len,
        "max_num_seqs": 16,
        "max_num_batched_tokens": settings.max_num_batched_tokens,
        "kv_cache_memory_bytes": KV_CACHE_BYTES,
    }


def server_flags(options: dict[str, Any], prefix_caching: bool) -> list[str]:
    flags = []
    for key, value in options.items():
        flags += [f"--{key.replace('_', '-')}", str(value)]
    return flags + ["--enable-prefix-caching" if prefix_caching else "--no-enable-prefix-caching"]


def serving_env(settings: SmokeSettings, in_process: bool) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        AUTOPORT_STANDIN="1",
        AUTOPORT_PORT_DIR=str(Path(settings.out_dir).resolve()),
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_ENABLE_V1_MULTIPROCESSING="0" if in_process else "1",
    )
    if settings.tp > 1:  # one thread per rank, ranks unbound (platform.py)
        env.update(VLLM_CPU_OMP_THREADS_BIND="nobind", OMP_NUM_THREADS="1")
    return env


def offline_run(settings: SmokeSettings, options: dict[str, Any]) -> OfflineRun:
    os.environ.update(serving_env(settings, in_process=settings.tp == 1))
    start = time.perf_counter()  # vLLM's imports included, as in the server's start-up
    from vllm import LLM, SamplingParams

    bf16 = settings.dtype == "bfloat16"
    vocab = int(_config(settings.checkpoint).get("vocab_size") or 0)
    raw = {"logprobs_mode": "raw_logits", "max_logprobs": vocab} if bf16 else {}
    llm = LLM(model=settings.checkpoint, enable_prefix_caching=False, **options, **raw)
    startup = time.perf_counter() - start
    prompts = [BASIC, *BATCH, COUNTING]
    sampling = SamplingParams(
        max_tokens=settings.max_tokens, temperature=0.0, ignore_eos=True, logprobs=vocab if bf16 else None
    )
    outputs = llm.generate(prompts, sampling)
    completions = [
        Completion(
            f"offline[{i}]",
            prompt,
            list(out.prompt_token_ids),
            list(out.outputs[0].token_ids),
            out.outputs[0].text,
        )
        for i, (prompt, out) in enumerate(zip(prompts, outputs, strict=True))
    ]
    logits = [_served_logits(out.outputs[0].logprobs, vocab) for out in outputs] if bf16 else []
    layout = llm.collective_rpc("kv_cache_layout")[0]
    del llm
    return OfflineRun(completions, startup, layout, logits)


def _served_logits(steps: Any, vocab: int) -> Any:
    """The raw logits vLLM returned for every generated token, ``[n, vocab]``."""
    import torch

    rows = torch.full((len(steps), vocab), float("-inf"))
    for row, entries in enumerate(steps):
        for token, entry in entries.items():
            if token < vocab:
                rows[row, token] = entry.logprob
    return rows


def server_run(
    settings: SmokeSettings, options: dict[str, Any], prefix_caching: bool
) -> tuple[BatteryRun, dict[str, float]]:
    name = "server-prefix-caching" if prefix_caching else "server"
    log = Path(settings.workdir) / f"{name}.log"
    flags = server_flags(options, prefix_caching) + ["--served-model-name", "port"]
    env = serving_env(settings, in_process=False)
    with running_server(settings.checkpoint, flags, log, env, settings.server_timeout) as server:
        run = run_battery(server, "port", settings.max_tokens)
        counters = metrics(server)
        run.figures["startup_s"] = server.startup_seconds
    return run, counters


def _config(checkpoint: str) -> dict[str, Any]:
    return json.loads((Path(checkpoint) / "config.json").read_text())


def context_length(config: dict[str, Any]) -> int:
    """512 positions, or the checkpoint's positions when it has fewer."""
    from .limits import checkpoint_positions

    return min(512, checkpoint_positions(config) or 512)


def block_size_for(config: dict[str, Any], default: int) -> int:
    """``default``, or its largest divisor that divides the sliding window
    (the segmented prefill kernel takes windows in whole blocks), as the
    validator chooses it."""
    from autoport_cst.validate.scenario import segment_block_size

    window = config.get("sliding_window")
    if isinstance(window, int) and window > 0 and config.get("use_sliding_window") is not False:
        return segment_block_size([window], default)
    return default


def offline_checks(settings: SmokeSettings, offline: OfflineRun, reference: Any) -> list[Check]:
    """Exact greedy tokens in float32 (with an FP8 KV cache, those of the
    validator's FP8 baseline); in bfloat16 the validator's logit gates."""
    if settings.kv_cache_dtype == "fp8":
        from .reference import FP8CacheGreedyReference

        fp8 = FP8CacheGreedyReference(settings.checkpoint)
        return greedy_checks("offline (FP8 KV cache, against the FP8 baseline)", offline.completions, fp8)
    if settings.dtype != "bfloat16":
        return greedy_checks("offline", offline.completions, reference)
    from .bf16_checks import bf16_logit_checks
    from .reference import TeacherForcedLogits

    served = list(zip(offline.completions, offline.logits, strict=True))
    return bf16_logit_checks("offline", served, TeacherForcedLogits(settings.checkpoint))


def check_battery_fits(settings: SmokeSettings, max_model_len: int) -> None:
    """``InputError`` when a prompt of the runs asked for and the tokens it
    asks for need more positions than the run has (vLLM would refuse the
    request mid-battery)."""
    from transformers import AutoTokenizer

    from autoport_cst.errors import InputError

    tokenizer = AutoTokenizer.from_pretrained(settings.checkpoint)
    prompts = [(prompt, settings.max_tokens) for prompt in (BASIC, *BATCH, COUNTING)]
    if set(settings.runs) - {"offline"}:
        prompts += server_prompts(settings.max_tokens)
    need, prompt, tokens = max((len(tokenizer(p).input_ids) + n, p, n) for p, n in prompts)
    if need > max_model_len:
        raise InputError(
            f"{settings.checkpoint}: the smoke battery needs {need} positions ({need - tokens} prompt tokens "
            f"of {prompt[:40]!r}... and {tokens} generated), the checkpoint allows {max_model_len}"
        )


def smoke(settings: SmokeSettings) -> dict[str, Any]:
    from .reference import GreedyReference

    config = _config(settings.checkpoint)
    check_battery_fits(settings, context_length(config))
    reference = GreedyReference(settings.checkpoint)
    settings.block_size = block_size_for(config, settings.block_size)
    options = engine_options(settings, context_length(config))
    checks: list[Check] = []
    figures: dict[str, Any] = {}
    runs: dict[str, BatteryRun] = {}
    if "offline" in settings.runs:
        offline = offline_run(settings, options)
        figures["offline"] = {"startup_s": offline.startup}
        checks.append(kv_cache_kind_check(offline.kv_cache_layout))
        if settings.kv_cache_dtype == "fp8":
            checks.append(kv_cache_dtype_check(offline.kv_cache_layout, "torch.float8_e4m3fn"))
        checks += offline_checks(settings, offline, reference)
    for prefix_caching in (False, True):
        name = "server-prefix-caching" if prefix_caching else "server"
        if name not in settings.runs:
            continue
        run, counters = server_run(settings, options, prefix_caching)
        runs[name] = run
        figures[name] = dict(run.figures)
        checks += greedy_checks(name, run.completions + run.batch, reference)
        checks += [batch_check(name, run), stream_check(name, run)]
        if prefix_caching:
            hits = counters.get("vllm:prefix_cache_hits_total", 0.0)
            queries = counters.get("vllm:prefix_cache_queries_total", 0.0)
            figures[name].update(prefix_cache_hits=hits, prefix_cache_queries=queries)
            checks.append(cache_hit_check(hits, queries))
    if len(runs) == 2:
        checks.append(same_runs(runs["server"], runs["server-prefix-caching"]))
    return {"checks": [check.as_dict() for check in checks], "figures": figures, "failure": None}


def _stop_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)  # unwinds through running_server, which stops the server


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    settings = SmokeSettings(**json.loads(Path(argv[0]).read_text()))
    try:
        outcome = smoke(settings)
    except ServerError as error:
        outcome = {"checks": [], "figures": {}, "failure": {"stage": "server", "message": str(error)}}
    except InputError as error:  # before anything started: bad input, exit 2 (smoke.run_smoke)
        outcome = {"checks": [], "figures": {}, "failure": {"stage": "input", "message": str(error)}}
    except Exception as error:  # the port failed inside vLLM: its stage and message
        stage = getattr(error, "stage", "engine")
        outcome = {
            "checks": [],
            "figures": {},
            "failure": {"stage": stage, "message": f"{type(error).__name__}: {error}"},
        }
    Path(settings.result).write_text(json.dumps(outcome, indent=2, default=str) + "\n")
    failed = outcome["failure"] is not None or not all(check["passed"] for check in outcome["checks"])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))


__all__ = ["RUNS", "SmokeSettings", "main", "smoke"]
