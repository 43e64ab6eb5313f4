"""The scenario of one validation run, from the checkpoint's config and the
run's parallel layout: the prompts, decode steps and KV-cache block size."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autoport_cst.errors import InputError

from .layout import ParallelLayout
from .scenario import (
    DEFAULT_PROMPT_LENGTHS,
    PREFIX_TOKENS,
    Scenario,
    cache_paths_fit,
    check_decode_tokens,
    default_prompt_lengths,
    segment_block_size,
)

if TYPE_CHECKING:  # pragma: no cover
    from .driver import PortOutput
    from .inputs import RunOptions


def plan_scenario(
    config: dict,
    checkpoint: Path,
    layout: ParallelLayout,
    tp: int,
    steps: int,
    prompt_lengths: tuple[int, ...] | None,
    block_size: int | None,
    seed: int,
) -> Scenario:
    """The prompts, steps and KV cache layout of the run."""
    vocab_size = config.get("vocab_size")
    if not isinstance(vocab_size, int) or vocab_size < 2:
        raise InputError(f"{checkpoint / 'config.json'}: no usable vocab_size")
    if block_size is None:
        block_size = segment_block_size(_sliding_windows(config) + _context_parallel_blocks(layout))
    _check_interleave(layout, block_size)
    if prompt_lengths is None and layout.dp > len(DEFAULT_PROMPT_LENGTHS):
        prompt_lengths = default_prompt_lengths(tp, layout.dp)
    return Scenario.build(
        vocab_size, tp, steps, prompt_lengths, block_size, seed, cache_paths=cache_paths_fit(tp)
    )


def with_decode_tokens(
    scenario: Scenario, decode_tokens: int, config: dict, layout: ParallelLayout
) -> Scenario:
    """The scenario with ``decode_tokens`` new tokens per sequence in each
    decode call (a speculative decoding verification step), validated with
    plain TP and without a sliding window: the decode kernel's mask takes one
    window start per sequence, its latest active token's
    (``gen_attention_decode_mask``), so on the device the earlier tokens of
    the step see a narrower window than transformers gives them."""
    check_decode_tokens(decode_tokens, scenario.steps)
    if decode_tokens == 1:
        return scenario
    if layout.disaggregated:
        raise InputError("decode steps of several tokens are validated with plain TP")
    if _sliding_windows(config):
        raise InputError(
            "decode steps of several tokens with a sliding window (or attention chunks): the decode kernel's "
            "mask takes one window start per sequence, so its earlier tokens see a narrower window (or "
            "chunk) than in transformers"
        )
    return replace(scenario, decode_tokens=decode_tokens)


def _sliding_windows(config: dict) -> list[int]:
    """Sliding windows and attention chunks the checkpoint's attention uses
    (the block size must divide them for segmented prefill)."""
    chunk = config.get("attention_chunk_size")  # chunked attention: whole blocks per chunk too
    chunks = [chunk] if isinstance(chunk, int) and not isinstance(chunk, bool) and chunk > 0 else []
    if config.get("use_sliding_window") is False:
        return chunks
    # sliding_window, or GPT-Neo's window_size (the window of its local layers)
    windows = [config.get(name) for name in ("sliding_window", "window_size")]
    return [w for w in windows if isinstance(w, int) and not isinstance(w, bool) and w > 0] + chunks


def _context_parallel_blocks(layout: ParallelLayout) -> list[int]:
    """Under DCP a cache block holds ``block_size * dcp`` positions of a
    sequence (a virtual block): the block size must let the shared prefix of
    the prefix-cache hit fill whole virtual blocks."""
    return [PREFIX_TOKENS // layout.dcp] if layout.dcp > 1 else []


def _check_interleave(layout: ParallelLayout, block_size: int) -> None:
    if layout.dcp > 1 and block_size % layout.dcp_interleave != 0:
        raise InputError(
            f"--dcp-interleave {layout.dcp_interleave} must divide the block size {block_size} "
            "(the KV cache is dealt to the DCP ranks in runs of that many positions within each block)"
        )


def report_settings(
    run: RunOptions, layout: ParallelLayout, steps: int, seed: int, scenario: Scenario
) -> dict[str, Any]:
    """The report's ``settings``: what was run."""
    settings: dict[str, Any] = {
        "tp": layout.tp,
        "ep": layout.ep,
        "dtype": run.dtype,
        "steps": steps,
        "prompt_lengths": list(scenario.prompt_lengths),
        "block_size": scenario.layout.block_size,
        "blocks_per_seq": scenario.layout.blocks_per_seq,
        "seed": seed,
        "prefill": run.prefill,
        "kv_cache_dtype": run.kv_cache_dtype,
    }
    if scenario.decode_tokens > 1:
        settings["decode_tokens"] = scenario.decode_tokens
    if layout.disaggregated:
        settings["layout"] = layout.describe()
    return settings


def describe_calls(port: PortOutput, scenario: Scenario) -> list[dict]:
    """The prefill calls the port ran, as data for the report."""
    kinds = {scenario.chunked: "chunked", scenario.prefix_hit: "prefix_cache_hit"}
    return [
        {
            "sequence": call.sequence,
            "kind": kinds.get(call.sequence, "whole") if call.segment else "whole",
            "positions": [call.start, call.end],
            "cached_seq_len": call.start,
            "kv_segment_size": call.segment,
            "rows": call.rows,
            "sampled_positions": list(call.sampled_positions),
        }
        for call in port.prefill_calls
    ]
