"""Run a port the way the serving engine does, on CPU.

``PortSession`` follows the engine's lifecycle: build the model under
``torch.device("meta")`` with ``<Prefix>ForCausalLM.from_configs(hf_config,
None)``, ask it for its KV-cache spec, allocate the paged caches and
``bind_kv_cache``, call ``load_weights(checkpoint_path, device, cache_dir)``
with the runner's positional arguments (the checkpoint directory, the CPU
device, no download directory), then check what is left on the meta device
(``meta_tensors``).

``run(teacher)`` prefills the prompts by the scenario's plan and then runs
``scenario.steps`` decode steps for the whole batch, feeding the teacher
tokens (teacher forcing), while forward hooks record each component's
output. Every call passes the runner's rank tensor and metadata
(``runner_metadata``). With ``prefill="auto"`` the run takes the scenario's
cache paths (a chunked prefill and a prefix-cache hit, segmented) when the
port reads ``kv_segment_size`` during the first prefill, and leaves those two
prompts out otherwise; ``"segmented"`` always takes them, ``"off"`` never.

The session runs inside a process where the stand-in is installed
(``standin_installed``) and the port package imported (``imported_package``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .components import Component, ComponentRecorder, find_components
from .config_reading import aliased_fields_missed
from .latent_cache import oversized_latent_layers
from .meta_tensors import guard_meta_attributes, unloaded_parameters_and_buffers
from .port_failure import PortFailure, port_frame
from .routing import ForcedTeacher, RoutedRun, RoutingMode, routing_mode
from .runner_metadata import PAD_SLOT, StepInputs, build_metadata
from .scenario import PrefillCall, Scenario
from .standin import kernel_phases, precision_notes
from .unread_fields import port_float_values

PREFILL_MODES = ("auto", "segmented", "off")


@dataclass
class PortOutput:
    """What a port run produced (one rank's view for TP > 1).

    ``sequences`` are the scenario's sequences the run fed, in order. Prefill
    entries are per call, in call order (calls go sequence by sequence),
    holding only the call's real rows; ``prefill_spans`` gives, per sequence,
    the positions ``[start, end)`` its prefill computed. Decode entries hold
    one row per sequence."""

    prefill_logits: list[torch.Tensor]  # per call [tokens, V]
    decode_logits: list[torch.Tensor]  # per step [B, V]
    components: list[Component]
    prefill_records: dict[str, list[torch.Tensor]]  # name -> per call
    decode_records: dict[str, list[torch.Tensor]]  # name -> per step
    unexpected_keys: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    prefill_calls: list[PrefillCall] = field(default_factory=list)
    prefill_spans: list[tuple[int, int]] = field(default_factory=list)
    sequences: list[int] = field(default_factory=list)
    segmented: bool = False
    guarded_attributes: list[str] = field(default_factory=list)
    # a run with forced expert choices (``ForcedTeacher``): the mode, holding the port's own choices
    routing: RoutedRun | None = None
    # an FP8 KV-cache run in process: the values its cache stored (``fp8_cache_forcing``)
    fp8_cache: Any = None
    # a TP > 1 run: the sequence-parallel prefill-length check's entries (``sp_length_check``)
    length_check: list[dict[str, Any]] | None = None
    # a run with embedding DP > 1: the rank-less forward check's entries (``rankless_check``)
    rankless_check: list[dict[str, Any]] | None = None
    # the float fields of the port's config dataclass (``unread_fields``)
    config_values: dict[str, float] = field(default_factory=dict)
    # kernel calls that computed below their inputs' precision (``fixed_precision``): kernel,
    # compute, given, site and the module paths on the stack, innermost first
    narrowed: list[dict[str, Any]] = field(default_factory=list)


def port_hf_config(checkpoint_dir: str | Path, dtype: torch.dtype) -> Any:
    """The ``PretrainedConfig`` the engine hands the factory, in ``dtype``."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(checkpoint_dir))
    config.dtype = dtype
    return config


def allocate_kv_cache(kv_spec: Any, scenario: Scenario, dtype: torch.dtype | None = None) -> dict[str, tuple]:
    """Zeroed ``(k, v)`` caches ``[num_blocks, kv_heads, block_size, head]``
    per layer, in the layer's dtype or ``dtype`` (an FP8 KV cache); a
    ``latent_kv`` layer (multi-latent attention) gets one buffer, ``(latent,)``."""
    layout = scenario.layout
    caches = {}
    for layer in kv_spec.layers:
        shape = (layout.num_blocks, layer.num_kv_heads, layout.block_size, layer.head_size)
        cache_dtype = dtype or layer.dtype
        buffers = 1 if getattr(layer, "latent_kv", False) else 2
        caches[layer.name] = tuple(torch.zeros(shape, dtype=cache_dtype) for _ in range(buffers))
    return caches


class PortSession:
    """A port built, bound to its KV cache and loaded; ``run`` drives it."""

    def __init__(
        self,
        factory: Any,
        checkpoint_dir: str | Path,
        hf_config: Any,
        scenario: Scenario,
        rank: int = 0,
        tp: int = 1,
        prefill: str = "auto",
        kv_cache_dtype: torch.dtype | None = None,
    ) -> None:
        if prefill not in PREFILL_MODES:
            raise ValueError(f"prefill must be one of {PREFILL_MODES}, got {prefill!r}")
        self.scenario, self.rank, self.tp, self.prefill = scenario, rank, tp, prefill
        self.timings: dict[str, float] = {}
        self.reads: set[str] = set()
        self.vocab_size = int(hf_config.get_text_config().vocab_size)
        start = time.perf_counter()
        self.model = self._build(factory, hf_config, scenario.on_device_sampling)
        try:
            self.kv_spec = self.model.get_kv_spec()
            oversized = oversized_latent_layers(self.kv_spec, hf_config)
            if oversized:
                raise PortFailure("kv_cache", oversized)
            self.layer_names = [layer.name for layer in self.kv_spec.layers]
            self.caches = allocate_kv_cache(self.kv_spec, scenario, kv_cache_dtype)
            self.model.bind_kv_cache(self.caches)
        except PortFailure:
            raise
        except Exception as error:
            raise PortFailure("kv_cache", f"{_describe(error)} in get_kv_spec / bind_kv_cache") from error
        self.timings["build"] = time.perf_counter() - start
        start = time.perf_counter()
        self.unexpected_keys = self._load(checkpoint_dir)
        self.timings["load"] = time.perf_counter() - start
        if scenario.prompt_embeds is not None and not _takes_prompt_embeds(self.model):
            raise PortFailure(
                "prefill",
                "the model's forward takes no prompt embeddings (inputs_embeds, is_token_ids)",
                refusal=True,
            )
        if scenario.decode_tokens > 1 and not _takes_named(self.model, "spec_decode_metadata"):
            raise PortFailure(
                "decode",
                "the model's forward takes no spec_decode_metadata (no speculative decoding)",
                refusal=True,
            )

    @staticmethod
    def _build(factory: Any, hf_config: Any, on_device_sampling: bool = False) -> Any:
        """The port's model: an ``nn.Module`` with the vllm_neuron model API
        (``get_kv_spec``, ``bind_kv_cache``, ``load_weights``, ...); with
        ``on_device_sampling``, given the neuron config of a sampling run
        (``sampled_output``)."""
        neuron_config = None
        if on_device_sampling:
            from .sampled_output import sampling_neuron_config

            neuron_config = sampling_neuron_config()
        try:
            with torch.device("meta"):
                model = factory.from_configs(hf_config, neuron_config)
        except Exception as error:
            raise PortFailure(
                "build", f"{_describe(error)} while building the model on the meta device"
            ) from error
        missed = aliased_fields_missed(model, hf_config)
        if missed:
            raise PortFailure("build", "the port's config misreads the model's config: " + "; ".join(missed))
        return model

    def _load(self, checkpoint_dir: str | Path) -> list[str]:
        from .standin.checkpoints import CheckpointError

        try:
            result = self.model.load_weights(str(checkpoint_dir), torch.device("cpu"), None)
        except CheckpointError:
            raise
        except Exception as error:
            raise PortFailure("load", f"{_describe(error)} in load_weights") from error
        unloaded = unloaded_parameters_and_buffers(self.model)
        if unloaded:
            raise PortFailure(
                "load",
                "tensors still on the meta device after load_weights: "
                + "; ".join(unloaded)
                + ". The engine builds the model under torch.device('meta'): a tensor computed "
                "in __init__ never holds data (compute it in forward), and every parameter "
                "must be loaded by load_weights.",
            )
        self.guarded = guard_meta_attributes(self.model)
        kernel_phases.guard_phase_methods(self.model)
        self.model.eval()
        return list(getattr(result, "unexpected_keys", []) or [])

    # -- one call ---------------------------------------------------------------

    def _forward(self, stage: str, step: StepInputs, with_rank: bool = True) -> torch.Tensor:
        """One forward in phase ``stage`` (its kernels: ``kernel_phases``);
        the logits of the sampled rows. Without ``with_rank``, the call omits
        ``rank`` (``rankless_check``)."""
        try:
            embeds: dict[str, Any] = {}
            if with_rank:
                embeds["rank"] = torch.tensor(self.rank, dtype=torch.int32)
            if step.inputs_embeds is not None:
                embeds.update(inputs_embeds=step.inputs_embeds, is_token_ids=step.is_token_ids)
            requests: tuple[torch.Tensor, torch.Tensor] | None = None
            if self.scenario.on_device_sampling:  # the runner's sampling parameters and logit mask
                from .sampled_output import forget_sampled, mask_width, runner_sampling

                forget_sampled(self.model)
                width = mask_width(self.model, self.vocab_size)
                requests = runner_sampling(step.input_ids, step.positions, step.sampling_positions, width)
                embeds["sampling_params"], embeds["logit_mask"] = requests
            with kernel_phases.phase(stage):
                output = self.model(
                    input_ids=step.input_ids,
                    positions=step.positions,
                    attn_metadata=step.metadata,
                    sampling_positions=step.sampling_positions,
                    **embeds,
                )
        except Exception as error:
            raise PortFailure(stage, f"{_describe(error)} in the {stage} forward") from error
        if self.scenario.on_device_sampling:
            from .sampled_output import lm_head_dp, sampled_logits

            rows = step.sampling_positions.numel()
            logits = sampled_logits(output, self.model, self.vocab_size, stage, rows, lm_head_dp(), requests)
            return logits.detach().clone()
        logits = output[0] if isinstance(output, (tuple, list)) else output
        if not isinstance(logits, torch.Tensor) or logits.is_meta:
            raise PortFailure(stage, f"the {stage} forward returned {type(logits).__name__}, not logits")
        sampled = step.sampling_positions.numel()
        if logits.dim() != 2 or logits.shape[0] != sampled:
            raise PortFailure(
                stage,
                f"the {stage} forward returned logits of shape {list(logits.shape)} for "
                f"{sampled} sampling position(s) {step.sampling_positions.tolist()[:8]} of "
                f"{step.input_ids.shape[0]} rows: one row of logits per sampling position",
            )
        if logits.shape[1] != self.vocab_size:  # an LM head over a padded vocabulary, returned uncut
            raise PortFailure(
                stage,
                f"the {stage} forward returned logits of {logits.shape[1]} ids for a vocabulary of "
                f"{self.vocab_size}: the LM head's padded vocabulary must be cut",
            )
        return logits.detach().clone()

    def prefill_call(self, call: PrefillCall) -> torch.Tensor:
        """One prefill forward of ``call`` (``PortFailure`` when the port raises)."""
        return self._forward("prefill", self._prefill_inputs(call))

    def _prefill_inputs(self, call: PrefillCall) -> StepInputs:
        prompt = self.scenario.prompts[call.sequence]
        table = self.scenario.block_table(call.sequence)
        padding = call.rows - call.tokens
        slots = [self.scenario.layout.slot(table, p) for p in range(call.start, call.end)]
        step = StepInputs(
            input_ids=torch.tensor(list(prompt[call.start : call.end]) + [0] * padding, dtype=torch.int64),
            positions=torch.tensor(list(range(call.start, call.end)) + [0] * padding, dtype=torch.int64),
            sampling_positions=torch.tensor(call.sampled, dtype=torch.int64),
            metadata=build_metadata(
                self.layer_names,
                self.reads,
                max_query_len=call.rows,
                slots=slots + [PAD_SLOT] * padding,
                tables=[table],
                block_size=self.scenario.layout.block_size,
                cached=[call.start],
                kv_segment_size=call.segment,
                decode_token_threshold=self.scenario.decode_tokens,
            ),
        )
        if self.scenario.prompt_embeds is not None:
            _embed_prompt(step, self.scenario.prompt_embeds[call.sequence], call)
        return step

    def _decode_inputs(
        self, step: int, tokens: list[int], sequences: tuple[int, ...], width: int = 1
    ) -> StepInputs:
        """The decode call of steps ``[step, step + width)``: ``width`` new
        tokens per sequence, sequence by sequence, every row sampled."""
        scenario = self.scenario
        cached = [len(scenario.prompts[b]) + step for b in sequences]
        positions = [first + j for first in cached for j in range(width)]
        tables = [scenario.block_table(b) for b in sequences]
        return StepInputs(
            input_ids=torch.tensor(tokens, dtype=torch.int64),
            positions=torch.tensor(positions, dtype=torch.int64),
            sampling_positions=torch.arange(len(positions), dtype=torch.int64),
            metadata=build_metadata(
                self.layer_names,
                self.reads,
                max_query_len=width,
                slots=[
                    scenario.layout.slot(table, first + j)
                    for table, first in zip(tables, cached, strict=True)
                    for j in range(width)
                ],
                tables=tables,
                block_size=scenario.layout.block_size,
                cached=cached,
                kv_segment_size=0,
                decode_token_threshold=scenario.decode_tokens,
            ),
        )

    # -- run ------------------------------------------------------------------

    def _cache_paths(self) -> bool:
        """Whether the run takes the cache paths (decided after the first call)."""
        if self.scenario.chunked is None or self.prefill == "off":
            return False
        return self.prefill == "segmented" or "kv_segment_size" in self.reads

    def run(self, teacher: list[list[int]], capture: bool = True) -> PortOutput:
        """Prefill the prompts, then ``steps`` decode steps over the batch
        fed with ``teacher[b][j]``."""
        components = find_components(self.model) if capture else []
        recorder = ComponentRecorder(self.model, components) if capture else None
        precision_notes.taken()  # a note from an earlier run is not this run's
        try:
            with torch.no_grad(), self._routing(teacher):
                calls, prefill_logits = self._run_prefill(recorder)
                sequences = self.scenario.sequences(any(call.segment for call in calls))
                decode_logits = self._run_decode(teacher, recorder, sequences)
        finally:
            if recorder:
                recorder.remove()
        output = PortOutput(
            prefill_logits=prefill_logits,
            decode_logits=decode_logits,
            components=components,
            prefill_records={c.name: [] for c in components},
            decode_records={c.name: [] for c in components},
            unexpected_keys=self.unexpected_keys,
            timings=dict(self.timings),
            prefill_calls=calls,
            prefill_spans=_spans(calls, sequences),
            sequences=list(sequences),
            segmented=any(call.segment for call in calls),
            guarded_attributes=list(self.guarded),
            routing=self.routing.result() if self.routing is not None else None,
            config_values=port_float_values(getattr(self.model, "config", None)),
            narrowed=_narrowed(self.model, precision_notes.taken()),
        )
        if recorder:
            self._keep_records(recorder, calls, output)
        return output

    @contextlib.contextmanager
    def _routing(self, teacher: list[list[int]]) -> Iterator[None]:
        """With a ``ForcedTeacher``: the MoE layers take its golden expert
        choices (``routing``), and ``self.routing`` records the port's own."""
        self.routing: RoutingMode | None = None
        if not isinstance(teacher, ForcedTeacher):
            yield
            return
        components = find_components(self.model)
        with routing_mode(
            self.model, components, teacher.experts, teacher.golden, rank=self.rank, tp=self.tp
        ) as mode:
            self.routing = mode
            yield

    def _route_rows(self, rows: list[tuple[int, int] | None]) -> None:
        """The tokens of the next forward's rows, for forced routing."""
        if self.routing is not None:
            self.routing.set_rows(rows)

    def _run_prefill(
        self, recorder: ComponentRecorder | None
    ) -> tuple[list[PrefillCall], list[torch.Tensor]]:
        start = time.perf_counter()
        first = PrefillCall(0, 0, len(self.scenario.prompts[0]))
        calls, logits = [first], []
        if recorder:
            recorder.set_tag(("prefill", 0))
        self._route_rows(_call_rows(first))
        logits.append(self._forward("prefill", self._prefill_inputs(first)))
        for call in self.scenario.prefill_plan(self._cache_paths())[1:]:
            if recorder:
                recorder.set_tag(("prefill", len(calls)))
            self._route_rows(_call_rows(call))
            logits.append(self._forward("prefill", self._prefill_inputs(call)))
            calls.append(call)
        self.timings["prefill"] = time.perf_counter() - start
        return calls, logits

    def _run_decode(self, teacher, recorder, sequences: tuple[int, ...]) -> list[torch.Tensor]:
        """The decode steps, ``Scenario.decode_tokens`` per call; the logits per step."""
        start = time.perf_counter()
        logits: list[torch.Tensor] = []
        for step, width in self.scenario.decode_calls():
            if recorder:
                recorder.set_tag(("decode", step))
            tokens = [teacher[b][step + j] for b in sequences for j in range(width)]
            self._route_rows(
                [(b, len(self.scenario.prompts[b]) + step + j) for b in sequences for j in range(width)]
            )
            rows = self._forward("decode", self._decode_inputs(step, tokens, sequences, width))
            logits += _per_step(rows, width)
        self.timings["decode"] = time.perf_counter() - start
        return logits

    def _keep_records(
        self, recorder: ComponentRecorder, calls: list[PrefillCall], output: PortOutput
    ) -> None:
        """Each call's real rows of each component output (this rank's share
        of them when the output is a sequence-parallel slice)."""
        for name, entries in recorder.records.items():
            for (phase, index), tensor in entries:
                rows = tensor.reshape(-1, tensor.shape[-1])
                if phase == "prefill":
                    output.prefill_records[name].append(_real_rows(rows, calls[index], self.rank, self.tp))
                else:
                    output.decode_records[name] += _per_step(rows, self.scenario.decode_width(index))


def _narrowed(model: Any, notes: list[precision_notes.Narrowed]) -> list[dict[str, Any]]:
    """The distinct narrowed kernel calls of a run, their modules named by path."""
    paths = {id(module): name for name, module in model.named_modules()}
    return distinct(
        [
            {
                "kernel": item.kernel,
                "compute": item.compute,
                "given": item.given,
                "site": item.site,
                "modules": [paths[i] for i in item.module_ids if i in paths],
            }
            for item in notes
        ]
    )


def distinct(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``entries`` without repeats, in order (every layer, step and rank notes the same call)."""
    found: list[dict[str, Any]] = []
    for entry in entries:
        if entry not in found:
            found.append(entry)
    return found


def _embed_prompt(step: StepInputs, embeddings: torch.Tensor, call: PrefillCall) -> None:
    """Feed the call's ``Scenario.embedded`` positions as prompt embeddings
    (full length, every rank the same: the port cuts its sequence-parallel
    slice), their token ids 0; padding rows stay token rows."""
    rows = call.rows
    is_token = torch.ones(rows, dtype=torch.bool)
    inputs = torch.zeros(rows, embeddings.shape[-1], dtype=embeddings.dtype)
    for row, position in enumerate(range(call.start, call.end)):
        if Scenario.embedded(position):
            is_token[row] = False
            inputs[row] = embeddings[position]
            step.input_ids[row] = 0
    step.inputs_embeds, step.is_token_ids = inputs, is_token


def _per_step(rows: torch.Tensor, width: int) -> list[torch.Tensor]:
    """A decode call's rows (``width`` per sequence, sequence by sequence)
    as one ``[B, ...]`` tensor per step."""
    if width == 1:
        return [rows]
    grouped = rows.reshape(-1, width, *rows.shape[1:])
    return [grouped[:, j] for j in range(width)]


def _takes_named(model: Any, name: str) -> bool:
    """Whether the model's forward names the argument ``name``."""
    import inspect

    try:
        return name in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False


def _takes_prompt_embeds(model: Any) -> bool:
    """Whether the model's forward names both prompt-embedding arguments."""
    import inspect

    try:
        parameters = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False
    return "inputs_embeds" in parameters and "is_token_ids" in parameters


def _real_rows(rows: torch.Tensor, call: PrefillCall, rank: int, tp: int) -> torch.Tensor:
    """The rows of ``rows`` that hold the call's tokens: all of a replicated
    output's first ``tokens`` rows, or this rank's part of them in a
    sequence-parallel slice (``rows / tp`` of the padded call)."""
    if rows.shape[0] == call.rows:
        return rows[: call.tokens]
    if rows.shape[0] * tp == call.rows:
        first = rank * rows.shape[0]
        keep = max(0, min(rows.shape[0], call.tokens - first))
        return rows[:keep]
    return rows


def _call_rows(call: PrefillCall) -> list[tuple[int, int] | None]:
    """The tokens of a prefill call's rows; padding rows are None."""
    tokens: list[tuple[int, int] | None] = [(call.sequence, p) for p in range(call.start, call.end)]
    return tokens + [None] * (call.rows - call.tokens)


def _spans(calls: list[PrefillCall], sequences: tuple[int, ...]) -> list[tuple[int, int]]:
    """Per sequence, the positions its prefill calls computed."""
    spans: dict[int, tuple[int, int]] = {}
    for call in calls:
        start = spans[call.sequence][0] if call.sequence in spans else call.start
        spans[call.sequence] = (start, call.end)
    return [spans[b] for b in sequences]


def _describe(error: BaseException) -> str:
    """``Type: message`` plus the innermost frame of the port's own code."""
    frame = port_frame(error)
    where = "" if frame is None else f" (at {frame.filename}:{frame.lineno}, in {frame.name})"
    return f"{type(error).__name__}: {error}{where}"
