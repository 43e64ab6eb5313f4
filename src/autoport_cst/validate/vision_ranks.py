"""Run a vision-language port with TP > 1: one forked process per rank
(``rank_start``), joined by torch.distributed with the gloo backend, so the
sharded loading of both towers and the collectives are real.

The parent computes the transformers reference first and hands every rank
the prompts and the teacher tokens in the job file; each rank runs the
prompts as ``VisionPortSession`` does at TP=1 and writes its runs (or its
failure) to ``rank<N>.pt``; ``merge_rank_runs`` joins the
sequence-parallel prefill slices.
"""

from __future__ import annotations

import pickle
import tempfile
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, BinaryIO

import torch

from autoport_cst.atomic import atomic_output

from .distributed import WORKER_TIMEOUT_S, RankJob, _free_port, _preload_rank_modules
from .driver import PortFailure
from .rank_start import start_forked_ranks
from .vision_prompts import VisionPrompt
from .vision_session import VisionPortRun, VisionPortSession, merge_rank_runs

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class VisionRankJob:
    world_size: int
    port: int
    model_dir: str
    checkpoint_dir: str
    dtype_name: str
    prompts: tuple[VisionPrompt, ...]
    teachers: tuple[tuple[int, ...], ...]
    on_device_sampling: bool = False


def _rank_main(job_path: Path, rank: int, teacher_stream: BinaryIO) -> int:
    """One rank: load the port, run every prompt, write the runs."""
    import torch.distributed as dist

    from .standin.checkpoints import CheckpointError

    job: VisionRankJob = pickle.loads(job_path.read_bytes())
    torch.set_num_threads(1)
    try:
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{job.port}",
            rank=rank,
            world_size=job.world_size,
            timeout=timedelta(seconds=WORKER_TIMEOUT_S),
        )
        result = {"kind": "done", "runs": _run_prompts(job, dist.group.WORLD)}
    except PortFailure as failure:
        result = {"kind": "error", "stage": failure.stage, "message": f"rank {rank}: {failure.message}"}
    except CheckpointError as error:  # the parent's transformers loaded it: the port's failure
        message = f"rank {rank}: the port cannot load a checkpoint transformers loads: {error}"
        result = {"kind": "error", "stage": "load", "message": message}
    except BaseException as error:  # noqa: BLE001 - report, never hang the parent
        result = {"kind": "error", "stage": "run", "message": f"rank {rank}: {type(error).__name__}: {error}"}
    with atomic_output(job_path.parent / f"rank{rank}.pt") as tmp:
        torch.save(result, tmp)
    try:
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001
        pass
    return 0 if result["kind"] == "done" else 1


def _run_prompts(job: VisionRankJob, group: Any) -> list[VisionPortRun]:
    from .driver import port_hf_config
    from .package import imported_package
    from .standin import standin_installed

    with standin_installed(group, job.world_size, model=job.checkpoint_dir):
        with imported_package(job.model_dir) as package:
            hf_config = port_hf_config(job.checkpoint_dir, _DTYPES[job.dtype_name])
            session = VisionPortSession(
                package.factory,
                job.checkpoint_dir,
                hf_config,
                len(job.prompts),
                group.rank(),
                on_device_sampling=job.on_device_sampling,
            )
            return session.run(job.prompts, [list(teacher) for teacher in job.teachers])


def _collect(ranks: list, directory: Path, world_size: int) -> list[dict[str, Any]]:
    deadline = time.monotonic() + WORKER_TIMEOUT_S
    results: dict[int, dict[str, Any]] = {}
    while len(results) < world_size:
        for rank, process in enumerate(ranks):
            path = directory / f"rank{rank}.pt"
            if rank not in results and path.exists():
                results[rank] = torch.load(path, weights_only=False)
            elif rank not in results and process.exit_code() is not None:
                raise RuntimeError(f"TP rank {rank} exited without a result\n{process.output_tail()}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"TP ranks did not finish within {WORKER_TIMEOUT_S:.0f} s")
        time.sleep(0.01)
    return [results[rank] for rank in range(world_size)]


def run_vision_ranks(
    model_dir: str | Path,
    checkpoint_dir: str | Path,
    dtype_name: str,
    prompts: tuple[VisionPrompt, ...],
    teachers: list[list[int]],
    world_size: int,
    on_device_sampling: bool = False,
) -> list[VisionPortRun]:
    """Per prompt, the ranks' runs merged (a failing rank raises ``PortFailure``);
    ``on_device_sampling``: the port built with a sampler (``VisionPortSession``)."""
    with tempfile.TemporaryDirectory(prefix="autoport-validate-vlm-") as tmp:
        job_path = Path(tmp) / "job.pkl"
        job = VisionRankJob(
            world_size,
            _free_port(),
            str(model_dir),
            str(checkpoint_dir),
            dtype_name,
            prompts,
            tuple(tuple(t) for t in teachers),
            on_device_sampling,
        )
        job_path.write_bytes(pickle.dumps(job))
        _preload_rank_modules(RankJob(world_size, 0, str(model_dir), str(checkpoint_dir), dtype_name, None))  # type: ignore[arg-type]
        ranks = start_forked_ranks(job_path, world_size, _rank_main)
        try:
            results = _collect(ranks, Path(tmp), world_size)
        finally:
            for rank in ranks:
                rank.stop()
    for result in results:
        if result["kind"] == "error":
            raise PortFailure(result["stage"], result["message"])
    return [
        merge_rank_runs([result["runs"][index] for result in results], len(prompt.input_ids))
        for index, prompt in enumerate(prompts)
    ]
