"""``StandinModelRunner``: vLLM's scheduler output through a port.

The runner's lifecycle is vLLM's: ``load_model`` builds the port through its
registry on the meta device and loads its weights (``port_loader``);
``get_kv_cache_spec`` reports the port's ``get_kv_spec()`` to vLLM's KV-cache
manager: a layer with a ``sliding_window_size`` as a sliding-window spec (vLLM
then frees, or never hands out, the blocks that fall out of the window, and
puts the null block 0 in their place), every other layer as full attention;
``initialize_kv_cache`` allocates the number of blocks vLLM chose, binds them
and keeps vLLM's KV-cache groups (layers of one kind share a group's block
ids); ``execute_model`` runs one scheduler step.

A step: the request states are updated from the scheduler output (new,
resumed, finished, new blocks), vLLM's ``InputBatch`` keeps the sampling
parameters, the scheduled tokens become the port's calls (``calls``), each
call's logits rows are collected per request, and vLLM's ``Sampler``
samples every request of the batch; the token of a request whose prompt is
not yet all computed (a chunk of a chunked prefill) is discarded, as vLLM's
GPU runner does.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import torch
from vllm.config import VllmConfig, set_current_vllm_config
from vllm.distributed.parallel_state import get_tp_group
from vllm.sampling_params import SamplingType
from vllm.utils.math_utils import cdiv
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheSpec, SlidingWindowSpec
from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT, ModelRunnerOutput
from vllm.v1.sample.logits_processor import build_logitsprocs
from vllm.v1.sample.sampler import Sampler
from vllm.v1.worker.gpu_input_batch import CachedRequestState, InputBatch

from autoport_cst.validate.driver import port_hf_config
from autoport_cst.validate.standin import kernel_phases
from autoport_cst.validate.standin.collectives import LOCAL_GROUP
from autoport_cst.validate.standin.neuron_config import NeuronConfig

from . import port_loader
from .calls import CacheLayout, PortCall, Work, plan_calls
from .limits import FP8_CACHE_DTYPES
from .port_tree import find_port_tree
from .step_stats import StepStats


class StandinModelRunner:
    def __init__(self, vllm_config: VllmConfig, device: torch.device) -> None:
        self.vllm_config = vllm_config
        self.model_config = vllm_config.model_config
        self.device = device
        self.block_size = vllm_config.cache_config.block_size
        self.max_model_len = self.model_config.max_model_len
        self.max_num_reqs = vllm_config.scheduler_config.max_num_seqs
        self.tp = vllm_config.parallel_config.tensor_parallel_size
        self.requests: dict[str, CachedRequestState] = {}
        self.kv_caches: dict[str, tuple] = {}
        self.reads: set[str] = set()
        self.stats = StepStats()
        self._stack = contextlib.ExitStack()
        self.input_batch = InputBatch(
            max_num_reqs=self.max_num_reqs,
            max_model_len=self.max_model_len,
            max_num_batched_tokens=vllm_config.scheduler_config.max_num_batched_tokens,
            device=device,
            vocab_size=self.model_config.get_vocab_size(),
            block_sizes=[self.block_size],
            max_num_blocks_per_req=[cdiv(self.max_model_len, self.block_size)],
            logitsprocs=build_logitsprocs(vllm_config, device, False, False, ()),
        )
        self.sampler = Sampler(logprobs_mode=self.model_config.logprobs_mode)

    # -- model ------------------------------------------------------------------------

    def load_model(self) -> None:
        """Build the port through its registry and load its weights."""
        tree = find_port_tree()
        group = get_tp_group().device_group if self.tp > 1 else LOCAL_GROUP
        port_loader.install_standin(self._stack, tree, group, self.tp)
        checkpoint = self.model_config.model
        architecture = port_loader.checkpoint_architecture(checkpoint)
        hf_config = port_hf_config(checkpoint, self.model_config.dtype)
        with set_current_vllm_config(self.vllm_config):
            self.model = port_loader.build_port(tree, architecture, hf_config, self._neuron_config())
            self.kv_spec = port_loader.kv_layers(self.model)
            port_loader.load_port_weights(self.model, checkpoint, self.vllm_config.load_config.download_dir)
        self.layer_names = [layer.name for layer in self.kv_spec.layers]

    def _neuron_config(self) -> NeuronConfig:
        """The run's ``neuron_config`` (``additional_config``), with on-device
        sampling off: vLLM's sampler samples from the port's logits."""
        values = dict((self.vllm_config.additional_config or {}).get("neuron_config") or {})
        values["on_device_sampling_config"] = None
        return NeuronConfig.from_dict(values)

    def get_model(self) -> Any:
        return self.model

    def _cache_dtype(self, layer: Any) -> torch.dtype:
        """The layer's dtype, or float8_e4m3fn with ``kv_cache_dtype`` fp8
        (the stand-in's FP8 cache; the platform refuses other cache dtypes)."""
        return fp8_cache_dtype(self.vllm_config.cache_config.cache_dtype) or layer.dtype

    def get_kv_cache_spec(self) -> dict[str, KVCacheSpec]:
        return {layer.name: self._layer_spec(layer) for layer in self.kv_spec.layers}

    def _layer_spec(self, layer: Any) -> KVCacheSpec:
        shape = {
            "block_size": self.block_size,
            "num_kv_heads": layer.num_kv_heads,
            "head_size": layer.head_size,
            "dtype": self._cache_dtype(layer),
        }
        window = getattr(layer, "sliding_window_size", None)
        if window:
            return SlidingWindowSpec(**shape, sliding_window=int(window))
        return FullAttentionSpec(**shape)

    def initialize_kv_cache(self, kv_cache_config: KVCacheConfig) -> None:
        num_blocks = kv_cache_config.num_blocks
        dtype = fp8_cache_dtype(self.vllm_config.cache_config.cache_dtype)
        self.kv_caches = port_loader.bind_port_cache(
            self.model, self.kv_spec, num_blocks, self.block_size, dtype
        )
        self.guarded = port_loader.finish_loading(self.model)
        self.layout = CacheLayout(self.block_size, cdiv(self.max_model_len, self.block_size), self.tp)
        self.groups = kv_cache_groups(kv_cache_config, self.layer_names)
        self.group_specs = [group.kv_cache_spec for group in kv_cache_config.kv_cache_groups]

    def kv_cache_layout(self) -> list[dict[str, Any]]:
        """Each layer as the port declares it (``sliding_window_size``), as
        vLLM's KV-cache manager holds it (its group's spec) and the dtype of
        the cache bound to it."""
        held = {
            name: spec for names, spec in zip(self.groups, self.group_specs, strict=True) for name in names
        }
        return [
            {
                "layer": layer.name,
                "port_window": getattr(layer, "sliding_window_size", None),
                "vllm_spec": type(held[layer.name]).__name__,
                "vllm_window": getattr(held[layer.name], "sliding_window", None),
                "vllm_dtype": str(held[layer.name].dtype),
                "bound_dtype": str(self.kv_caches[layer.name][0].dtype),
            }
            for layer in self.kv_spec.layers
        ]

    def shutdown(self) -> None:
        self._stack.close()

    # -- one step ---------------------------------------------------------------------

    @torch.no_grad()
    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        start = time.perf_counter()
        self._update_states(scheduler_output)
        if scheduler_output.total_num_scheduled_tokens == 0:
            return EMPTY_MODEL_RUNNER_OUTPUT
        works = self._works(scheduler_output)
        logits = self._run_calls(plan_calls(works, self.layout, self.groups, self.reads))
        output = self._sample(works, logits)
        self.stats.step_seconds += time.perf_counter() - start
        return output

    def _works(self, scheduler_output: SchedulerOutput) -> list[Work]:
        works = []
        for index, req_id in enumerate(self.input_batch.req_ids):
            state = self.requests[req_id]
            tokens = list(state.prompt_token_ids or []) + list(state.output_token_ids)
            count = scheduler_output.num_scheduled_tokens[req_id]
            blocks = tuple(list(ids) for ids in state.block_ids)
            works.append(Work(index, tokens, state.num_computed_tokens, count, blocks))
        return works

    def _run_calls(self, calls: list[PortCall]) -> dict[int, torch.Tensor]:
        """Each request's logits row (the last sampled row of its calls)."""
        rows: dict[int, torch.Tensor] = {}
        for call in calls:
            if call.stage == "prefill" and call.inputs.metadata[self.layer_names[0]]["kv_segment_size"]:
                self._check_segmented()
            start = time.perf_counter()
            logits = self._forward(call)
            self.stats.record(call, time.perf_counter() - start)
            for row, owner in enumerate(call.owners):
                rows[owner] = logits[row]
        return rows

    def _check_segmented(self) -> None:
        if "kv_segment_size" not in self.reads:
            raise port_loader.PortError(
                "prefill",
                "a chunk after cached tokens (chunked prefill or a prefix-cache hit) needs segmented "
                "prefill, and the port never read kv_segment_size from its attention metadata",
            )

    def _forward(self, call: PortCall) -> torch.Tensor:
        step = call.inputs
        try:
            with kernel_phases.phase(call.stage):
                output = self.model(
                    input_ids=step.input_ids,
                    positions=step.positions,
                    attn_metadata=step.metadata,
                    sampling_positions=step.sampling_positions,
                    rank=torch.tensor(get_tp_group().rank_in_group, dtype=torch.int32),
                )
        except Exception as error:
            raise port_loader.PortError(
                call.stage, f"{port_loader.describe(error)} in the {call.stage} forward"
            ) from error
        logits = output[0] if isinstance(output, (tuple, list)) else output
        expected = step.sampling_positions.numel()
        if not isinstance(logits, torch.Tensor) or logits.dim() != 2 or logits.shape[0] != expected:
            shape = list(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
            raise port_loader.PortError(
                call.stage, f"the forward returned {shape} for {expected} sampling position(s)"
            )
        return logits

    def _sample(self, works: list[Work], rows: dict[int, torch.Tensor]) -> ModelRunnerOutput:
        batch = self.input_batch
        vocab = self.model_config.get_vocab_size()
        logits = torch.stack([rows[work.request] for work in works]).to(torch.float32)[:, :vocab]
        output = self.sampler(logits, batch.sampling_metadata)
        sampled = output.sampled_token_ids.tolist()
        for work in works:
            if work.end < len(work.token_ids):  # a chunk of a prompt: no token yet
                sampled[work.request] = []
                generator = batch.generators.get(work.request)
                if generator is not None:
                    generator.set_offset(generator.get_offset() - 4)
        self._keep_sampled(sampled)
        logprobs = output.logprobs_tensors.tolists() if output.logprobs_tensors is not None else None
        return ModelRunnerOutput(
            req_ids=list(batch.req_ids),
            req_id_to_index=dict(batch.req_id_to_index),
            sampled_token_ids=sampled,
            logprobs=logprobs,
            prompt_logprobs_dict={},
        )

    def _keep_sampled(self, sampled: list[list[int]]) -> None:
        batch = self.input_batch
        for index, tokens in enumerate(sampled):
            if not tokens:
                continue
            start = batch.num_tokens_no_spec[index]
            batch.token_ids_cpu[index, start : start + len(tokens)] = tokens
            batch.is_token_ids[index, start : start + len(tokens)] = True
            batch.num_tokens_no_spec[index] = start + len(tokens)
            self.requests[batch.req_ids[index]].output_token_ids.extend(tokens)

    # -- request states ---------------------------------------------------------------

    def _update_states(self, scheduler_output: SchedulerOutput) -> None:
        batch = self.input_batch
        for req_id in scheduler_output.finished_req_ids:
            self.requests.pop(req_id, None)
            batch.remove_request(req_id)
        scheduled = set(scheduler_output.num_scheduled_tokens)
        resumed = scheduler_output.scheduled_cached_reqs.resumed_req_ids
        for req_id in set(batch.req_id_to_index) - (scheduled - resumed):
            batch.remove_request(req_id)
        to_add = [self._new_state(new) for new in scheduler_output.scheduled_new_reqs]
        to_add += self._update_cached(scheduler_output)
        for state in to_add:
            batch.add_request(state)
        batch.condense()
        batch.refresh_metadata()

    def _new_state(self, new: Any) -> CachedRequestState:
        params = new.sampling_params
        generator = None
        if params is not None and params.sampling_type == SamplingType.RANDOM_SEED:
            generator = torch.Generator(device=self.device)
            generator.manual_seed(params.seed)
        state = CachedRequestState(
            req_id=new.req_id,
            prompt_token_ids=new.prompt_token_ids,
            mm_features=new.mm_features,
            sampling_params=params,
            generator=generator,
            block_ids=tuple(list(ids) for ids in new.block_ids),
            num_computed_tokens=new.num_computed_tokens,
            output_token_ids=[],
        )
        self.requests[new.req_id] = state
        self.stats.cached_at_admission(new.num_computed_tokens)
        return state

    def _update_cached(self, scheduler_output: SchedulerOutput) -> list[CachedRequestState]:
        data, batch, to_add = scheduler_output.scheduled_cached_reqs, self.input_batch, []
        for i, req_id in enumerate(data.req_ids):
            state = self.requests[req_id]
            state.num_computed_tokens = data.num_computed_tokens[i]
            del state.output_token_ids[data.num_output_tokens[i] :]
            new_blocks = data.new_block_ids[i]
            if req_id in data.resumed_req_ids:
                state.block_ids = tuple(list(ids) for ids in new_blocks or ())
            elif new_blocks is not None:
                for ids, more in zip(state.block_ids, new_blocks, strict=False):
                    ids.extend(more)
            index = batch.req_id_to_index.get(req_id)
            if index is None:
                to_add.append(state)
                continue
            batch.num_computed_tokens_cpu[index] = state.num_computed_tokens
            if new_blocks is not None:
                batch.block_table.append_row(new_blocks, index)
        return to_add

    def get_supported_tasks(self) -> tuple[str, ...]:
        return ("generate",)


def fp8_cache_dtype(cache_dtype: str) -> torch.dtype | None:
    """float8_e4m3fn for vLLM's FP8 KV-cache names, None for ``auto``."""
    return torch.float8_e4m3fn if cache_dtype in FP8_CACHE_DTYPES else None


def kv_cache_groups(kv_cache_config: KVCacheConfig, layer_names: list[str]) -> list[list[str]]:
    """The port's layers of each of vLLM's KV-cache groups, in the groups'
    order (the order of a request's block ids); every layer in one."""
    groups = [
        [name for name in group.layer_names if name in layer_names]
        for group in kv_cache_config.kv_cache_groups
    ]
    grouped = [name for group in groups for name in group]
    if sorted(grouped) != sorted(layer_names):
        raise port_loader.PortError(
            "kv_cache",
            f"vLLM's KV-cache groups {groups} do not hold each of the port's layers {layer_names} once",
        )
    return groups


__all__ = ["StandinModelRunner", "kv_cache_groups"]
