"""``StandinPlatform``: vLLM's CPU platform whose worker serves a port.

Everything vLLM's CPU platform sets up stays (devices, distributed backend,
memory, scheduling without async outputs); on top of it:

- the worker is ``worker.StandinWorker``, whose model runner builds the
  port through its registry and runs it on the stand-in's kernels;
- the model runs eagerly (the port is not a vLLM model to compile);
- with one rank and ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` the engine may run
  in-process (vLLM's CPU platform insists on worker processes to bind
  OpenMP threads, which the stand-in does not need);
- a TP size or context length the checkpoint does not allow
  (``limits``: the tensor-parallel rules, the config's positions), or a
  KV-cache dtype the stand-in cannot serve in the run asked for (FP8 with
  prefix caching or chunked prompts), is refused before any engine process starts: the reason on stderr, exit 2
  (vLLM accepts TP 4 over 4 heads and 2 KV heads, which the port's
  sharding does not, and a context past the positions under
  ``VLLM_ALLOW_LONG_MAX_MODEL_LEN``).
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from vllm.platforms.cpu import CpuPlatform

if TYPE_CHECKING:  # vllm.config imports the platform: import it when configuring
    from vllm.config import VllmConfig

WORKER = "autoport_cst.serve.worker.StandinWorker"


class StandinPlatform(CpuPlatform):
    @classmethod
    def check_and_update_config(cls, vllm_config: VllmConfig) -> None:
        from vllm.config import CompilationMode

        parallel = vllm_config.parallel_config
        in_process = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1") == "0" and parallel.world_size == 1
        backend = parallel.distributed_executor_backend
        refuse_beyond_checkpoint(vllm_config)
        if parallel.worker_cls == "auto":
            parallel.worker_cls = WORKER
        if parallel.world_size > 1:
            # vLLM binds each CPU rank to a NUMA node of its own; the stand-in's
            # ranks share the machine's (tiny models, gloo collectives)
            os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        super().check_and_update_config(vllm_config)
        if in_process and backend in (None, "uni"):
            parallel.distributed_executor_backend = "uni"
        vllm_config.compilation_config.mode = CompilationMode.NONE
        vllm_config.model_config.enforce_eager = True


def refuse_beyond_checkpoint(vllm_config: VllmConfig) -> None:
    """Exit 2, saying why, when the run's TP size or context length is more
    than the checkpoint allows (``limits``)."""
    from autoport_cst.errors import InputError

    from .limits import check_cache_dtype, check_context_length, check_serving_tp

    model = vllm_config.model_config
    if model is None:
        return
    config = model.hf_config.to_dict()
    source = f"{model.model}/config.json"
    try:
        check_serving_tp(config, vllm_config.parallel_config.tensor_parallel_size, source)
        check_context_length(config, model.max_model_len, source)
        check_cache_dtype(
            vllm_config.cache_config.cache_dtype,
            bool(vllm_config.cache_config.enable_prefix_caching),
            vllm_config.scheduler_config.max_num_batched_tokens,
            model.max_model_len,
        )
    except InputError as error:
        print(f"autoport-cst: the stand-in cannot serve this run: {error}", file=sys.stderr)
        raise SystemExit(2) from None
