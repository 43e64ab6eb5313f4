"""Run a vision-language port the way the serving engine does, on CPU.

The port is built under ``torch.device("meta")`` with
``<Prefix>ForConditionalGeneration.from_configs(hf_config, None)``, bound to
zeroed paged KV caches and loaded with ``load_weights`` (``PortSession``'s
lifecycle, in ``driver``). A prompt then runs as the runner runs it:

- with images: ``embed_multimodal(pixel_values, image_grid_thw)`` (the
  tower), ``get_mrope_input_positions(input_ids, image_grid_thw)`` (the
  M-RoPE positions ``[3, T]`` and the delta of later positions), one prefill
  call with ``rotary_position_ids`` and ``vision_embeddings``;
- decode steps with ``rotary_position_ids = position + delta`` on all three
  rows; a text-only prompt passes no vision inputs and no rotary positions
  (the text path).

Prefill samples every position; forward hooks record each component's
output (``vision_components``). The stand-in must be installed and the
package imported around the session.

With ``on_device_sampling`` the port is built as the runner builds it by
default, with a sampler (``sampled_output.sampling_neuron_config``: logprobs
asked for), handed the runner's requests and a logit mask per row
(``sampled_output.runner_sampling``): every call's logits are the ones it
returns beside the sampled tokens, after ``sampled_output``'s checks (the
padded vocabulary's ids masked before the sampler, the logits cut to the
vocabulary, the tokens the sampler's choice with those requests). Without it a call's logits must
be as wide as the vocabulary too (a padded LM head's, cut).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .components import ComponentRecorder
from .driver import PortFailure, PortSession, _describe
from .runner_metadata import build_metadata
from .standin import kernel_phases
from .vision_components import vision_language_components
from .vision_prompts import VisionPrompt

BLOCK_SIZE = 32
BLOCKS_PER_SEQUENCE = 4  # a 128-token context, as the decode kernel needs


@dataclass
class VisionPortRun:
    """One prompt: logits and component rows per position ``[T + steps, ...]``."""

    logits: torch.Tensor
    records: dict[str, torch.Tensor] = field(default_factory=dict)
    rope_positions: torch.Tensor | None = None
    rope_delta: int = 0
    # component -> phase ("vision", "prefill", "decode") -> the rows this rank recorded
    phase_records: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)


class VisionPortSession:
    """A vision-language port built, bound to its KV cache and loaded."""

    def __init__(
        self,
        factory: Any,
        checkpoint_dir: str | Path,
        hf_config: Any,
        sequences: int,
        rank: int = 0,
        on_device_sampling: bool = False,
    ) -> None:
        self.rank = rank
        self.on_device_sampling = on_device_sampling
        self.vocab_size = int(hf_config.get_text_config().vocab_size)
        self.model = PortSession._build(factory, hf_config, on_device_sampling)
        self.tables = [
            tuple(2 + 2 * b + s * 2 * sequences for s in range(BLOCKS_PER_SEQUENCE)) for b in range(sequences)
        ]
        num_blocks = 2 + 2 * sequences * BLOCKS_PER_SEQUENCE
        try:
            kv_spec = self.model.get_kv_spec()
            self.layer_names = [layer.name for layer in kv_spec.layers]
            self.model.bind_kv_cache(
                {
                    layer.name: tuple(
                        torch.zeros(
                            num_blocks, layer.num_kv_heads, BLOCK_SIZE, layer.head_size, dtype=layer.dtype
                        )
                        for _ in range(2)
                    )
                    for layer in kv_spec.layers
                }
            )
        except Exception as error:
            raise PortFailure("kv_cache", f"{_describe(error)} in get_kv_spec / bind_kv_cache") from error
        PortSession._load(self, checkpoint_dir)  # type: ignore[arg-type]
        self.reads: set[str] = set()

    def _slot(self, sequence: int, position: int) -> int:
        table = self.tables[sequence]
        return table[position // BLOCK_SIZE] * BLOCK_SIZE + position % BLOCK_SIZE

    def _call(self, stage: str, **inputs: Any) -> torch.Tensor:
        rows = inputs["sampling_positions"].numel()
        requests = None
        if self.on_device_sampling:  # the runner's sampling parameters and logit mask, per row
            from .sampled_output import forget_sampled, mask_width, runner_sampling

            forget_sampled(self.model)
            width = mask_width(self.model, self.vocab_size)
            requests = runner_sampling(
                inputs["input_ids"], inputs["positions"], inputs["sampling_positions"], width
            )
            inputs["sampling_params"], inputs["logit_mask"] = requests
        try:
            with kernel_phases.phase(stage):
                output = self.model(rank=torch.tensor(self.rank, dtype=torch.int32), **inputs)
        except Exception as error:
            raise PortFailure(stage, f"{_describe(error)} in the {stage} forward") from error
        if self.on_device_sampling:
            from .sampled_output import sampled_logits

            logits = sampled_logits(output, self.model, self.vocab_size, stage, rows, requests=requests)
            return logits.detach().float()
        logits = output[0] if isinstance(output, (tuple, list)) else output
        if not isinstance(logits, torch.Tensor) or logits.dim() != 2 or logits.shape[0] != rows:
            raise PortFailure(
                stage, f"the {stage} forward did not return one row of logits per sampling position"
            )
        if logits.shape[1] != self.vocab_size:  # an LM head over a padded vocabulary, returned uncut
            raise PortFailure(
                stage,
                f"the {stage} forward returned logits of {logits.shape[1]} ids for a vocabulary of "
                f"{self.vocab_size}: the LM head's padded vocabulary must be cut",
            )
        return logits.detach().float()

    def _metadata(self, sequence: int, start: int, end: int) -> dict:
        return build_metadata(
            self.layer_names,
            self.reads,
            max_query_len=end - start,
            slots=[self._slot(sequence, p) for p in range(start, end)],
            tables=[self.tables[sequence]],
            block_size=BLOCK_SIZE,
            cached=[start],
            kv_segment_size=0,
        )

    def _vision_inputs(self, prompt: VisionPrompt) -> tuple[dict[str, Any], int]:
        """The prefill's vision keywords and the delta of later positions."""
        if prompt.images is None:
            return {}, 0
        images = prompt.images
        try:
            with kernel_phases.phase("prefill"):
                embeddings = self.model.embed_multimodal(images.pixel_values, images.grid_thw)
            rope, delta = self.model.get_mrope_input_positions(list(prompt.input_ids), images.grid_thw)
        except Exception as error:
            raise PortFailure(
                "vision", f"{_describe(error)} in the vision tower or the M-RoPE positions"
            ) from error
        return {"rotary_position_ids": rope, "vision_embeddings": embeddings}, int(delta)

    def _prefill(self, sequence: int, prompt: VisionPrompt, vision: dict[str, Any]) -> torch.Tensor:
        length = len(prompt.input_ids)
        return self._call(
            "prefill",
            input_ids=torch.tensor(prompt.input_ids, dtype=torch.int64),
            positions=torch.arange(length),
            attn_metadata=self._metadata(sequence, 0, length),
            sampling_positions=torch.arange(length),
            **vision,
        )

    def _decode_step(
        self, prompts: tuple[VisionPrompt, ...], teachers: list[list[int]], deltas: list[int], step: int
    ) -> torch.Tensor:
        """Decode step ``step`` of every sequence in one batch (row ``b``:
        sequence ``b``), fed its teacher token. With an image in the batch
        every row carries its M-RoPE position ``position + delta``."""
        positions = [len(prompt.input_ids) + step for prompt in prompts]
        rotary = None
        if any(prompt.images is not None for prompt in prompts):
            rotary = torch.tensor([p + d for p, d in zip(positions, deltas, strict=True)]).expand(3, -1)
        metadata = build_metadata(
            self.layer_names,
            self.reads,
            max_query_len=1,
            slots=[self._slot(b, p) for b, p in enumerate(positions)],
            tables=self.tables[: len(prompts)],
            block_size=BLOCK_SIZE,
            cached=positions,
            kv_segment_size=0,
        )
        return self._call(
            "decode",
            input_ids=torch.tensor([teacher[p] for teacher, p in zip(teachers, positions, strict=True)]),
            positions=torch.tensor(positions),
            attn_metadata=metadata,
            sampling_positions=torch.arange(len(prompts)),
            rotary_position_ids=rotary,
        )

    def run(self, prompts: tuple[VisionPrompt, ...], teachers: list[list[int]]) -> list[VisionPortRun]:
        """Prefill each prompt in its own call (its images through the tower
        first), then decode all of them together with their teacher tokens
        (as many steps as the shortest teacher continuation)."""
        tower, text = vision_language_components(self.model)
        recorder = ComponentRecorder(self.model, tower + text)
        prefills, deltas, ropes = [], [], []
        try:
            for index, prompt in enumerate(prompts):
                recorder.set_tag(("vision", index))
                vision, delta = self._vision_inputs(prompt)
                recorder.set_tag(("prefill", index))
                prefills.append(self._prefill(index, prompt, vision))
                deltas.append(delta)
                ropes.append(vision.get("rotary_position_ids"))
            recorder.set_tag(("decode", None))
            steps = min(len(t) - len(p.input_ids) for p, t in zip(prompts, teachers, strict=True))
            decoded = [self._decode_step(prompts, teachers, deltas, step) for step in range(steps)]
        finally:
            recorder.remove()
        return [
            _sequence_run(index, recorder.records, prefills[index], decoded, ropes[index], deltas[index])
            for index in range(len(prompts))
        ]


def _sequence_run(
    index: int,
    records: dict[str, list[tuple[Any, torch.Tensor]]],
    prefill_logits: torch.Tensor,
    decoded: list[torch.Tensor],
    rope: torch.Tensor | None,
    delta: int,
) -> VisionPortRun:
    """Sequence ``index``'s rows: its tower and prefill calls, its row of each decode step."""
    phases: dict[str, dict[str, torch.Tensor]] = {}
    for name, calls in records.items():
        for phase in PHASES:
            if phase == "decode":
                rows = [tensor[index : index + 1].float() for tag, tensor in calls if tag[0] == phase]
            else:
                rows = [tensor.float() for tag, tensor in calls if tag == (phase, index)]
            if rows:
                phases.setdefault(name, {})[phase] = torch.cat(rows)
    logits = torch.cat([prefill_logits] + [step[index : index + 1] for step in decoded])
    run = VisionPortRun(logits, {}, rope, delta, phases)
    run.records = {name: torch.cat(list(by_phase.values())) for name, by_phase in phases.items()}
    return run


PHASES = ("vision", "prefill", "decode")


def merge_rank_runs(runs: list[VisionPortRun], prompt_length: int) -> VisionPortRun:
    """One run from the TP ranks' runs of a prompt: a prefill record holding
    fewer rows than the prompt is a sequence-parallel slice (the slices are
    joined in rank order); every other record, the logits and the positions
    are rank 0's (each rank holds them whole)."""
    first = runs[0]
    records = {}
    for name, by_phase in first.phase_records.items():
        parts = []
        for phase, rows in by_phase.items():
            if phase == "prefill" and rows.shape[0] < prompt_length:
                rows = torch.cat([run.phase_records[name][phase] for run in runs])
            parts.append(rows)
        records[name] = torch.cat(parts)
    return VisionPortRun(first.logits, records, first.rope_positions, first.rope_delta, first.phase_records)
