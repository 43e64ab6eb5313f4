"""Run a port the way the serving engine does, on CPU.

``PortSession`` follows the engine's lifecycle: build the model under
``torch.device("meta")`` with ``<Prefix>ForCausalLM.from_configs(hf_config,
None)``, ask it for its KV-cache spec, allocate the paged caches and
``bind_kv_cache``, ``load_weights(checkpoint_dir)``, then check that no tensor
is left on the meta device. ``run(teacher)`` prefills every prompt (one
sequence per call; logits for every prompt position) and then runs
``scenario.steps`` decode steps for the whole batch, feeding the teacher
tokens (teacher forcing), while forward hooks record each component's output.

The session runs inside a process where the stand-in is installed
(``standin_installed``) and the port package imported (``imported_package``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .components import Component, ComponentRecorder, find_components
from .scenario import Scenario

DECODE_TOKEN_THRESHOLD = 1


class PortFailure(Exception):
    """The port failed at a stage of the run (build, load, prefill, decode).
    The message says what and where; ``stage`` names the stage."""

    def __init__(self, stage: str, message: str) -> None:
        super().__init__(message)
        self.stage = stage
        self.message = message


@dataclass
class PortOutput:
    """What a port run produced (one rank's view for TP > 1)."""

    prefill_logits: list[torch.Tensor]  # per sequence [T_b, V]
    decode_logits: list[torch.Tensor]  # per step [B, V]
    components: list[Component]
    prefill_records: dict[str, list[torch.Tensor]]  # name -> per sequence
    decode_records: dict[str, list[torch.Tensor]]  # name -> per step
    unexpected_keys: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)


def port_hf_config(checkpoint_dir: str | Path, dtype: torch.dtype) -> Any:
    """The ``PretrainedConfig`` the engine hands the factory, in ``dtype``."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(checkpoint_dir))
    config.dtype = dtype
    return config


def find_meta_tensors(model: nn.Module) -> list[str]:
    """Every parameter, buffer or tensor attribute still on the meta device."""
    found: list[str] = []
    for name, param in model.named_parameters():
        if param.is_meta:
            found.append(f"parameter '{name}' (not loaded from the checkpoint)")
    for name, buffer in model.named_buffers():
        if buffer is not None and buffer.is_meta:
            found.append(f"buffer '{name}' (computed in __init__)")
    for module_name, module in model.named_modules():
        for attribute, value in vars(module).items():
            if attribute.startswith("_") or not isinstance(value, torch.Tensor):
                continue
            if value.is_meta:
                where = f"{module_name}.{attribute}" if module_name else attribute
                found.append(f"tensor attribute '{where}' (computed in __init__)")
    return found


def allocate_kv_cache(kv_spec: Any, scenario: Scenario) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Zeroed ``(k, v)`` caches ``[num_blocks, kv_heads, block_size, head]`` per layer."""
    layout = scenario.layout
    caches = {}
    for layer in kv_spec.layers:
        shape = (layout.num_blocks, layer.num_kv_heads, layout.block_size, layer.head_size)
        caches[layer.name] = (
            torch.zeros(shape, dtype=layer.dtype),
            torch.zeros(shape, dtype=layer.dtype),
        )
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
    ) -> None:
        self.scenario = scenario
        self.rank = rank
        self.timings: dict[str, float] = {}
        start = time.perf_counter()
        try:
            with torch.device("meta"):
                model = factory.from_configs(hf_config, None)
        except Exception as error:
            raise PortFailure("build", f"{_describe(error)} while building the model on the meta device") from error
        self.model: nn.Module = model
        try:
            self.kv_spec = model.get_kv_spec()
            self.layer_names = [layer.name for layer in self.kv_spec.layers]
            self.caches = allocate_kv_cache(self.kv_spec, scenario)
            model.bind_kv_cache(self.caches)
        except Exception as error:
            raise PortFailure("kv_cache", f"{_describe(error)} in get_kv_spec / bind_kv_cache") from error
        self.timings["build"] = time.perf_counter() - start

        start = time.perf_counter()
        from .standin.checkpoints import CheckpointError

        try:
            result = model.load_weights(str(checkpoint_dir))
        except CheckpointError:
            raise
        except Exception as error:
            raise PortFailure("load", f"{_describe(error)} in load_weights") from error
        self.unexpected_keys = list(getattr(result, "unexpected_keys", []) or [])
        meta = find_meta_tensors(model)
        if meta:
            raise PortFailure(
                "load",
                "tensors still on the meta device after load_weights: "
                + "; ".join(meta)
                + ". The engine builds the model under torch.device('meta'): a tensor computed "
                "in __init__ never holds data (compute it in forward), and every parameter "
                "must be loaded by load_weights.",
            )
        model.eval()
        self.timings["load"] = time.perf_counter() - start

    # -- metadata -------------------------------------------------------------

    def _metadata(self, query_len: int, slots: list[int], rows: list[int]) -> dict[str, dict[str, Any]]:
        layout = self.scenario.layout
        table = torch.tensor([layout.block_tables[r] for r in rows], dtype=torch.int32)
        entry = {
            "max_query_len": query_len,
            "decode_token_threshold": DECODE_TOKEN_THRESHOLD,
            "slot_mapping": torch.tensor(slots, dtype=torch.int64),
            "block_size": layout.block_size,
            "block_table_tensor": table,
            "max_blocks_per_seq": layout.blocks_per_seq,
        }
        return {name: dict(entry) for name in self.layer_names}

    def _forward(self, stage: str, **inputs: Any) -> torch.Tensor:
        try:
            output = self.model(**inputs)
        except Exception as error:
            raise PortFailure(stage, f"{_describe(error)} in the {stage} forward") from error
        logits = output[0] if isinstance(output, (tuple, list)) else output
        if not isinstance(logits, torch.Tensor) or logits.is_meta:
            raise PortFailure(stage, f"the {stage} forward returned {type(logits).__name__}, not logits")
        return logits.detach().clone()

    # -- run ------------------------------------------------------------------

    def run(self, teacher: list[list[int]], capture: bool = True) -> PortOutput:
        """Prefill each prompt, then ``steps`` decode steps over the batch
        fed with ``teacher[b][j]``."""
        scenario = self.scenario
        components = find_components(self.model) if capture else []
        recorder = ComponentRecorder(self.model, components) if capture else None
        prefill_logits: list[torch.Tensor] = []
        decode_logits: list[torch.Tensor] = []
        start = time.perf_counter()
        try:
            with torch.no_grad():
                for b, prompt in enumerate(scenario.prompts):
                    length = len(prompt)
                    if recorder:
                        recorder.set_tag(("prefill", b))
                    prefill_logits.append(
                        self._forward(
                            "prefill",
                            input_ids=torch.tensor(prompt, dtype=torch.int64),
                            positions=torch.arange(length, dtype=torch.int64),
                            attn_metadata=self._metadata(
                                length, [scenario.layout.slot(b, p) for p in range(length)], [b]
                            ),
                            sampling_positions=torch.arange(length, dtype=torch.int64),
                        )
                    )
                self.timings["prefill"] = time.perf_counter() - start
                start = time.perf_counter()
                rows = list(range(scenario.batch))
                for step in range(scenario.steps):
                    positions = [len(p) + step for p in scenario.prompts]
                    if recorder:
                        recorder.set_tag(("decode", step))
                    decode_logits.append(
                        self._forward(
                            "decode",
                            input_ids=torch.tensor([teacher[b][step] for b in rows], dtype=torch.int64),
                            positions=torch.tensor(positions, dtype=torch.int64),
                            attn_metadata=self._metadata(
                                1, [scenario.layout.slot(b, positions[b]) for b in rows], rows
                            ),
                            sampling_positions=torch.arange(scenario.batch, dtype=torch.int64),
                        )
                    )
                self.timings["decode"] = time.perf_counter() - start
        finally:
            if recorder:
                recorder.remove()

        prefill_records: dict[str, list[torch.Tensor]] = {c.name: [] for c in components}
        decode_records: dict[str, list[torch.Tensor]] = {c.name: [] for c in components}
        if recorder:
            for name, entries in recorder.records.items():
                for (phase, _index), tensor in entries:
                    rows_tensor = tensor.reshape(-1, tensor.shape[-1])
                    (prefill_records if phase == "prefill" else decode_records)[name].append(rows_tensor)
        return PortOutput(
            prefill_logits=prefill_logits,
            decode_logits=decode_logits,
            components=components,
            prefill_records=prefill_records,
            decode_records=decode_records,
            unexpected_keys=self.unexpected_keys,
            timings=dict(self.timings),
        )


def _describe(error: BaseException) -> str:
    """``Type: message`` plus the innermost frame of the port's own code."""
    import traceback

    frames = traceback.extract_tb(error.__traceback__)
    where = ""
    for frame in reversed(frames):
        if "autoport_cst" not in frame.filename and "/torch/" not in frame.filename:
            where = f" (at {frame.filename}:{frame.lineno}, in {frame.name})"
            break
    return f"{type(error).__name__}: {error}{where}"
