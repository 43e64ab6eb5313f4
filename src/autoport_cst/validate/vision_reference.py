"""The transformers side of a vision-language validation: the checkpoint's
``...ForConditionalGeneration`` run on each prompt (``vision_prompts``).

For each prompt the float32 model picks the greedy continuation (the
teacher tokens), then one forward over the prompt and its continuation
records every compared component (``vision_components``) and the logits at
every position, the way the port's prefill and decode steps together cover
them. A bfloat16 run of the same weights on the same tokens gives the
baseline error of the R-ratio (at TP > 1, where the eager one fails, a second
one with the row-parallel projections summed as the ranks sum them:
``partial_sums``). ``get_rope_index`` gives the M-RoPE
positions the port's are checked against.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .components import ComponentRecorder
from .partial_sums import split_row_parallel
from .reference import load_reference
from .vision_components import vision_language_components
from .vision_prompts import VisionPrompt


@dataclass
class VisionReferenceRun:
    """One prompt in one dtype: rows per position ``[T + steps, ...]``."""

    tokens: list[int]  # the prompt and the teacher tokens
    logits: torch.Tensor
    records: dict[str, torch.Tensor] = field(default_factory=dict)
    rope_positions: torch.Tensor | None = None  # [3, T] from get_rope_index
    rope_delta: int = 0


def _inputs(model: Any, prompt: VisionPrompt, tokens: list[int]) -> dict[str, Any]:
    inputs: dict[str, Any] = {"input_ids": torch.tensor([tokens])}
    if prompt.images is not None:
        extra = len(tokens) - len(prompt.input_ids)
        inputs["pixel_values"] = prompt.images.pixel_values.to(model.dtype)
        inputs["image_grid_thw"] = prompt.images.grid_thw
        inputs["mm_token_type_ids"] = prompt.token_types(model.config.image_token_id, extra)
    return inputs


def _forward(model: Any, prompt: VisionPrompt, tokens: list[int]) -> torch.Tensor:
    model.model.rope_deltas = None  # positions from these tokens, not a previous call's
    with torch.no_grad():
        return model(**_inputs(model, prompt, tokens)).logits[0].float()


def greedy_tokens(model: Any, prompt: VisionPrompt, steps: int) -> list[int]:
    tokens = list(prompt.input_ids)
    for _ in range(steps):
        tokens.append(int(torch.argmax(_forward(model, prompt, tokens)[-1])))
    return tokens


def recorded_run(model: Any, prompt: VisionPrompt, tokens: list[int]) -> VisionReferenceRun:
    """Logits and component rows of one forward over ``tokens``."""
    tower, text = vision_language_components(model)
    recorder = ComponentRecorder(model, tower + text)
    try:
        logits = _forward(model, prompt, tokens)
    finally:
        recorder.remove()
    records = {}
    for name, calls in recorder.records.items():
        if calls:
            tensor = calls[-1][1].float()
            records[name] = tensor[0] if tensor.dim() == 3 and tensor.shape[0] == 1 else tensor
    return VisionReferenceRun(tokens, logits, records)


def rope_index(model: Any, prompt: VisionPrompt) -> tuple[torch.Tensor, int]:
    """transformers' M-RoPE positions ``[3, T]`` of the prompt and its delta."""
    ids = torch.tensor([list(prompt.input_ids)])
    types = prompt.token_types(model.config.image_token_id)
    grid = prompt.images.grid_thw if prompt.images is not None else None
    positions, delta = model.model.get_rope_index(ids, types, image_grid_thw=grid)
    return positions[:, 0], int(delta.reshape(-1)[0])


def run_vision_reference(
    checkpoint_dir: str | Path, prompts: tuple[VisionPrompt, ...], steps: int, bf16: bool
) -> tuple[list[VisionReferenceRun], list[VisionReferenceRun] | None]:
    """Per prompt the float32 run (with its M-RoPE positions) and, with
    ``bf16``, the bfloat16 run on the same tokens."""
    model = load_reference(checkpoint_dir, torch.float32)
    fp32 = []
    for prompt in prompts:
        run = recorded_run(model, prompt, greedy_tokens(model, prompt, steps))
        run.rope_positions, run.rope_delta = rope_index(model, prompt)
        fp32.append(run)
    if not bf16:
        return fp32, None
    return fp32, bf16_runs(checkpoint_dir, prompts, fp32)


def bf16_runs(
    checkpoint_dir: str | Path,
    prompts: tuple[VisionPrompt, ...],
    fp32: list[VisionReferenceRun],
    row_parallel: int = 1,
) -> list[VisionReferenceRun]:
    """The bfloat16 run of each prompt on the float32 run's tokens; with
    ``row_parallel`` N > 1, the row-parallel projections summed as N ranks
    sum them (``partial_sums``)."""
    model = load_reference(checkpoint_dir, torch.bfloat16)
    split_row_parallel(model, row_parallel)
    return [recorded_run(model, prompt, run.tokens) for prompt, run in zip(prompts, fp32, strict=True)]
