"""``StandinWorker``: one vLLM worker process (one TP rank) serving a port.

vLLM's engine drives a worker through a fixed set of calls: ``init_device``
(the distributed environment: gloo ranks on CPU), ``load_model``,
``get_kv_cache_spec``, ``determine_available_memory``,
``initialize_from_config``, ``compile_or_warm_up_model``, then
``execute_model`` once per scheduler step. Each is answered here by
``runner.StandinModelRunner``; what a port cannot do (LoRA, sleep mode,
speculative decoding) is refused with a message.
"""

from __future__ import annotations

import os
from typing import Any

import psutil
import torch
from vllm.config import VllmConfig
from vllm.platforms import current_platform
from vllm.utils.torch_utils import set_random_seed
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheSpec
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.worker.gpu_worker import init_worker_distributed_environment
from vllm.v1.worker.worker_base import CompilationTimes, WorkerBase

from .runner import StandinModelRunner


class StandinWorker(WorkerBase):
    def __init__(
        self,
        vllm_config: VllmConfig,
        local_rank: int,
        rank: int,
        distributed_init_method: str,
        is_driver_worker: bool = False,
    ) -> None:
        super().__init__(vllm_config, local_rank, rank, distributed_init_method, is_driver_worker)
        self.runner: StandinModelRunner | None = None

    def init_device(self) -> None:
        self.device = torch.device("cpu")
        # the name vLLM's CPU communicator gives the ranks' shared memory (as its CPU worker sets it)
        method = self.distributed_init_method
        os.environ["VLLM_DIST_IDENT"] = (
            os.path.basename(method.removeprefix("file://"))
            if method.startswith("file://")
            else method.split(":")[-1]
        )
        init_worker_distributed_environment(
            self.vllm_config,
            self.rank,
            self.distributed_init_method,
            self.local_rank,
            current_platform.dist_backend,
        )
        set_random_seed(self.model_config.seed)
        self.runner = StandinModelRunner(self.vllm_config, self.device)

    @property
    def _runner(self) -> StandinModelRunner:
        if self.runner is None:
            raise RuntimeError("the worker's device is not initialized (init_device)")
        return self.runner

    def load_model(self, *, load_dummy_weights: bool = False) -> None:
        if load_dummy_weights:
            raise ValueError("the stand-in worker loads the port's checkpoint only")
        self._runner.load_model()

    def get_model(self) -> Any:
        return self._runner.get_model()

    def get_kv_cache_spec(self) -> dict[str, KVCacheSpec]:
        return self._runner.get_kv_cache_spec()

    def determine_available_memory(self) -> int:
        """Bytes for the KV cache: ``kv_cache_memory_bytes`` when set (vLLM's
        CPU platform sets it from ``VLLM_CPU_KVCACHE_SPACE``), else the
        ``gpu_memory_utilization`` share of the machine's memory less what this
        process holds."""
        explicit = self.cache_config.kv_cache_memory_bytes
        if explicit is not None:
            return int(explicit)
        memory = psutil.virtual_memory()
        requested = int(memory.total * self.cache_config.gpu_memory_utilization)
        held = psutil.Process(os.getpid()).memory_info().rss
        return max(0, min(requested - held, memory.available, self._enough()))

    def _enough(self) -> int:
        """Twice what ``max_num_seqs`` sequences of ``max_model_len`` tokens
        hold (room for the prefix cache): a CPU stand-in has no use for a
        cache sized to the machine's memory, which others share."""
        specs = self.get_kv_cache_spec().values()
        per_block = sum(spec.page_size_bytes for spec in specs)
        blocks = -(-self.model_config.max_model_len // self.cache_config.block_size)
        return 2 * self.scheduler_config.max_num_seqs * blocks * per_block

    def initialize_from_config(self, kv_cache_config: KVCacheConfig) -> None:
        self.cache_config.num_gpu_blocks = kv_cache_config.num_blocks
        self._runner.initialize_kv_cache(kv_cache_config)

    def compile_or_warm_up_model(self) -> CompilationTimes:
        set_random_seed(self.model_config.seed)
        return CompilationTimes(language_model=0.0, encoder=0.0)

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        return self._runner.execute_model(scheduler_output)

    def sample_tokens(self, grammar_output: Any) -> ModelRunnerOutput:
        raise RuntimeError("the stand-in worker samples in execute_model (structured outputs are not served)")

    def get_supported_tasks(self) -> tuple[str, ...]:
        return self._runner.get_supported_tasks()

    def take_draft_token_ids(self) -> None:
        return None

    def reset_mm_cache(self) -> None:
        return None

    def reset_encoder_cache(self) -> None:
        return None

    def serving_stats(self) -> dict[str, float]:
        """The port's work so far (``step_stats``), for the smoke test."""
        return self._runner.stats.as_dict()

    def kv_cache_layout(self) -> list[dict[str, Any]]:
        """Each layer's window in the port and in vLLM's KV-cache manager."""
        return self._runner.kv_cache_layout()

    def shutdown(self) -> None:
        if self.runner is not None:
            self.runner.shutdown()
