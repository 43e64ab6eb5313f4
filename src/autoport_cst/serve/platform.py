"""``StandinPlatform``: vLLM's CPU platform whose worker serves a port.

Everything vLLM's CPU platform sets up stays (devices, distributed backend,
memory, scheduling without async outputs); on top of it:

- the worker is ``worker.StandinWorker``, whose model runner builds the
  port through its registry and runs it on the stand-in's kernels;
- the model runs eagerly (the port is not a vLLM model to compile);
- with one rank and ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` the engine may run
  in-process (vLLM's CPU platform insists on worker processes to bind
  OpenMP threads, which the stand-in does not need).
"""

from __future__ import annotations

import os
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
