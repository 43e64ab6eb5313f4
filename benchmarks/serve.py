"""Benchmark: a port served by vLLM on CPU through the stand-in plugin,
against the same prompts through our own driver.

Run with the serve environment's Python (README: serving):

    .venv-serve/bin/python benchmarks/serve.py OUT_DIR CHECKPOINT [--tokens 32]

In one run, with vLLM's offline engine in this process (TP=1, float32):

- engine start-up: ``LLM(...)`` until it is ready;
- time to first token: each battery prompt alone with ``max_tokens=1``
  (median), and tokens per second of the battery's prompts generated
  together (``--tokens`` each);
- the same prompts and tokens through ``validate.driver.PortSession`` (the
  validator's serving-like driver: one prefill call per prompt, then batched
  decode steps fed vLLM's tokens), and the plugin's overhead: vLLM's wall
  time over the driver's, and the share of vLLM's step time spent outside
  the port's forward calls;
- prefix caching: the three shared-prefix prompts of the battery, one after
  another, on an engine without and one with prefix caching: the prompt
  tokens the port computed (measured by the runner), the cache hits and the
  prefill time.

The load average is printed before and after: on a shared machine wall times
grow with the load; compare figures of one run.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from autoport_cst.serve.battery import BASIC, BATCH, COUNTING, PREFIX_SUFFIXES, SHARED_PREFIX, STREAM  # noqa: E402

PROMPTS = [BASIC, *BATCH, COUNTING, STREAM]


def engine_settings(checkpoint: str) -> dict:
    """The smoke test's engine: float32, 512 positions or the checkpoint's
    fewer, blocks of 32 or the largest divisor of the sliding window."""
    import json

    from autoport_cst.serve.smoke_child import block_size_for, context_length

    config = json.loads((Path(checkpoint) / "config.json").read_text())
    return {
        "dtype": "float32",
        "block_size": block_size_for(config, 32),
        "max_model_len": context_length(config),
        "max_num_seqs": 16,
    }


def engine(checkpoint: str, prefix_caching: bool):
    from vllm import LLM

    start = time.perf_counter()
    llm = LLM(
        model=checkpoint,
        enable_prefix_caching=prefix_caching,
        kv_cache_memory_bytes=64 << 20,
        **engine_settings(checkpoint),
    )
    return llm, time.perf_counter() - start


def close(llm) -> None:
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()
    cleanup_dist_env_and_memory()


def stats(llm) -> dict[str, float]:
    return llm.collective_rpc("serving_stats")[0]


def delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {key: after[key] - before[key] for key in after}


def greedy(tokens: int):
    from vllm import SamplingParams

    return SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)


def battery(llm, tokens: int) -> tuple[list, dict[str, float]]:
    first = []
    for prompt in PROMPTS:
        start = time.perf_counter()
        llm.generate([prompt], greedy(1), use_tqdm=False)
        first.append(time.perf_counter() - start)
    before = stats(llm)
    start = time.perf_counter()
    outputs = llm.generate(PROMPTS, greedy(tokens), use_tqdm=False)
    wall = time.perf_counter() - start
    work = delta(stats(llm), before)
    generated = sum(len(out.outputs[0].token_ids) for out in outputs)
    figures = {
        "ttft_median_s": statistics.median(first),
        "tokens_per_s": generated / wall,
        "wall_s": wall,
        "step_s": work["step_seconds"],
        "forward_s": work["prefill_seconds"] + work["decode_seconds"],
    }
    return outputs, figures


def driver(out_dir: Path, checkpoint: str, outputs, tokens: int) -> float:
    """Seconds of prefill and decode for the same prompts and tokens through
    the validator's driver (the port imported from the tree, stand-in kernels)."""
    import torch

    from autoport_cst.serve.port_loader import checkpoint_architecture
    from autoport_cst.serve.port_tree import registry_packages
    from autoport_cst.validate.driver import PortSession, port_hf_config
    from autoport_cst.validate.package import imported_package
    from autoport_cst.validate.scenario import PagedLayout, Scenario
    from autoport_cst.validate.standin import standin_installed

    prompts = tuple(tuple(out.prompt_token_ids) for out in outputs)
    teacher = [list(out.outputs[0].token_ids) for out in outputs]
    longest = max(len(p) for p in prompts) + tokens
    scenario = Scenario(prompts, tokens - 1, PagedLayout.plan(len(prompts), longest, 32, 0))
    package = registry_packages(out_dir)[checkpoint_architecture(checkpoint)]
    with standin_installed(), imported_package(out_dir / "vllm_neuron" / "model" / package) as port:
        session = PortSession(
            port.factory, checkpoint, port_hf_config(checkpoint, torch.float32), scenario, prefill="off"
        )
        session.run(teacher, capture=False)
    return session.timings["prefill"] + session.timings["decode"]


def prefix_work(llm, caching: bool) -> dict[str, float]:
    if caching:
        llm.reset_prefix_cache()
    before = stats(llm)
    for suffix in PREFIX_SUFFIXES:
        llm.generate([SHARED_PREFIX + suffix], greedy(4), use_tqdm=False)
    work = delta(stats(llm), before)
    return {
        key: work[key]
        for key in ("prefill_tokens", "prefill_rows", "cached_prompt_tokens", "prefill_seconds")
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("checkpoint")
    parser.add_argument("--tokens", type=int, default=32)
    args = parser.parse_args()
    os.environ.update(AUTOPORT_STANDIN="1", AUTOPORT_PORT_DIR=str(args.out_dir.resolve()))
    os.environ.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", HF_HUB_OFFLINE="1")
    print(f"load average before: {os.getloadavg()}")
    llm, startup = engine(args.checkpoint, prefix_caching=False)
    print(f"engine start-up: {startup:.1f} s (in-process engine, TP=1)")
    outputs, figures = battery(llm, args.tokens)
    print(
        f"battery ({len(PROMPTS)} prompts, {args.tokens} tokens each): time to first token {figures['ttft_median_s'] * 1000:.0f} ms "
        f"(median), {figures['tokens_per_s']:.0f} tokens/s"
    )
    plain = prefix_work(llm, caching=False)
    vllm_config = llm.llm_engine.vllm_config
    close(llm)
    from vllm.config import set_current_vllm_config

    with set_current_vllm_config(vllm_config):  # what the port reads of vLLM's config
        seconds = driver(args.out_dir, args.checkpoint, outputs, args.tokens)
    print(
        f"driver: the same prompts and tokens in {seconds:.3f} s; vLLM {figures['wall_s']:.3f} s: "
        f"overhead {figures['wall_s'] / seconds:.2f}x; vLLM's step time outside the port's forward "
        f"{1 - figures['forward_s'] / figures['step_s']:.0%}"
    )
    llm, _ = engine(args.checkpoint, prefix_caching=True)
    cached = prefix_work(llm, caching=True)
    close(llm)
    print(
        f"prefix caching, {len(PREFIX_SUFFIXES)} prompts sharing a prefix: prompt tokens computed "
        f"{plain['prefill_tokens']:.0f} off, {cached['prefill_tokens']:.0f} on "
        f"({cached['cached_prompt_tokens']:.0f} from the cache; rows incl. padding {plain['prefill_rows']:.0f} -> "
        f"{cached['prefill_rows']:.0f}); prefill time {plain['prefill_seconds'] * 1000:.0f} ms -> {cached['prefill_seconds'] * 1000:.0f} ms"
    )
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
