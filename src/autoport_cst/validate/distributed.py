"""Run a port with TP > 1: one local process per rank, joined by
torch.distributed with the gloo backend, so sharded weight loading and the
all-gather / reduce-scatter / all-reduce collectives are real.

The ranks are forked from this process once it has imported what a rank
runs (on Linux), or started as fresh interpreters (``python -m
autoport_cst.validate.distributed JOB RANK``): see ``rank_start``. Either
way nothing depends on how the caller's ``__main__`` is written. The parent
writes the job (a pickled ``RankJob``), starts the ranks, computes the
transformers reference and the teacher tokens while they build and load the
port, then sends the teacher tokens through each rank's pipe. Every rank
writes its result (``PortOutput`` or an error) to ``rank<N>.pt`` in the job
directory. ``merge_rank_outputs`` reassembles the sequence-parallel slices
(a prefill output holding ``T / tp`` rows on each rank) in rank order.
"""

from __future__ import annotations

import pickle
import socket
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, BinaryIO

import torch

from autoport_cst.atomic import atomic_output
from autoport_cst.errors import InputError

from . import rankless_check
from .driver import PortFailure, PortOutput, distinct
from .layout import ParallelLayout
from .rank_start import start_forked_ranks, start_interpreter_ranks, start_method
from .scenario import Scenario
from .sp_length_check import LengthRule, declared_rule, merged, probe, sequence_parallel
from .standin.dtype_utils import KV_CACHE_DTYPES

WORKER_TIMEOUT_S = 600.0
_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


class RankCheckpointError(Exception):
    """A rank's checkpoint load failed (re-raised as InputError by the API)."""


@dataclass(frozen=True)
class RankJob:
    world_size: int
    port: int
    model_dir: str
    checkpoint_dir: str
    dtype_name: str
    scenario: Scenario
    ep_degree: int = 1
    prefill: str = "auto"
    kv_cache_dtype: str = "auto"
    layout: ParallelLayout | None = None  # data / context parallelism (layout_session)
    length_rule: LengthRule | None = None  # the prefill-length check to ask for (sp_length_check)
    rank_default: str | None = None  # where the reference declares rank=None (rankless_check)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# -- the rank process ------------------------------------------------------------


def _rank_main(job_path: Path, rank: int, teacher_stream: BinaryIO) -> int:
    import torch.distributed as dist

    job: RankJob = pickle.loads(job_path.read_bytes())
    result_path = job_path.parent / f"rank{rank}.pt"

    def finish(result: dict[str, Any]) -> None:
        with atomic_output(result_path) as tmp:
            torch.save(result, tmp)

    torch.set_num_threads(1)
    try:
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{job.port}",
            rank=rank,
            world_size=job.world_size,
            timeout=timedelta(seconds=WORKER_TIMEOUT_S),
        )
    except Exception as error:  # noqa: BLE001
        finish({"kind": "error", "category": "internal", "stage": "init", "message": str(error)})
        return 1
    try:
        return _run_rank(job, job_path, rank, teacher_stream, finish)
    except BaseException as error:  # noqa: BLE001 - report, never hang the parent
        message = "".join(traceback.format_exception(error))
        finish({"kind": "error", "category": "internal", "stage": "run", "message": message})
    finally:
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001
            pass
    return 1


def _run_rank(
    job: RankJob,
    job_path: Path,
    rank: int,
    teacher_stream: BinaryIO,
    finish: Callable[[dict[str, Any]], None],
) -> int:
    """Load and run the port; a failure the parent reports in its own terms
    (checkpoint, port, input) is written as the rank's result."""
    from .package import PortImportError
    from .standin.checkpoints import CheckpointError

    def error(
        category: str, stage: str, message: str, refusal: bool = False, raised_in: str | None = None
    ) -> int:
        finish(
            {
                "kind": "error",
                "category": category,
                "stage": stage,
                "message": message,
                "refusal": refusal,
                "raised_in": raised_in,
            }
        )
        return 1

    try:
        return _load_and_run(job, job_path, rank, teacher_stream, finish)
    except CheckpointError as failure:
        return error("checkpoint", "load", str(failure))
    except PortFailure as failure:
        return error("port", failure.stage, failure.message, failure.refusal, failure.raised_in)
    except PortImportError as failure:
        return error("port", "import", str(failure))
    except InputError as failure:
        return error("input", "input", str(failure))


def _load_and_run(
    job: RankJob,
    job_path: Path,
    rank: int,
    teacher_stream: BinaryIO,
    finish: Callable[[dict[str, Any]], None],
) -> int:
    """Install the stand-in and load the port, say so (``rank<N>.loaded``),
    then run it on the teacher tokens the parent sends (none: stop)."""
    import torch.distributed as dist

    from .driver import port_hf_config
    from .package import imported_package
    from .standin import parallel_state, standin_installed

    with standin_installed(
        dist.group.WORLD,
        job.world_size,
        model=job.checkpoint_dir,
        ep_degree=job.ep_degree,
        cache_dtype=job.kv_cache_dtype,
        layout=job.layout,
        rank=rank,
    ) as installation:
        with imported_package(job.model_dir) as package:
            hf_config = port_hf_config(job.checkpoint_dir, _DTYPES[job.dtype_name])
            session = _session(job, package.factory, hf_config, rank)
            if job.ep_degree > 1 and not parallel_state.expert_parallel_read():
                raise InputError(
                    f"expert parallelism was asked for (EP degree {job.ep_degree}) but the port "
                    "never reads the EP degree or rank (get_neuron_ep_degree / get_neuron_ep_rank): "
                    "it does not implement expert parallelism; validate it without --ep"
                )
            (job_path.parent / f"rank{rank}.loaded").touch()
            try:
                teacher = pickle.load(teacher_stream)
            except EOFError:
                return 0  # the parent stopped before the run
            if teacher is None:
                return 0
            output = session.run(teacher)
            if job.length_rule is not None and sequence_parallel(output, job.world_size):
                output.length_check = probe(session, job.length_rule, job.world_size)
            if job.rank_default is not None and hasattr(session, "decode_batch"):
                started = time.process_time()
                output.rankless_check = rankless_check.probe(session, teacher, output)
                output.timings["rankless_check_cpu"] = time.process_time() - started
            description = installation.describe()
            if job.layout is not None and job.layout.disaggregated:
                description["parallel_groups"] = _group_ranks(parallel_state)
            finish(
                {"kind": "done", "output": output, "factory": package.factory_name, "stand_in": description}
            )
            return 0


def _session(job: RankJob, factory: Any, hf_config: Any, rank: int):
    from .driver import PortSession
    from .layout_session import LayoutSession

    cache_dtype = KV_CACHE_DTYPES.get(job.kv_cache_dtype)
    if job.layout is not None and job.layout.disaggregated:
        return LayoutSession(
            factory,
            job.checkpoint_dir,
            hf_config,
            job.scenario,
            job.layout,
            rank,
            prefill=job.prefill,
            kv_cache_dtype=cache_dtype,
        )
    return PortSession(
        factory,
        job.checkpoint_dir,
        hf_config,
        job.scenario,
        rank,
        job.world_size,
        prefill=job.prefill,
        kv_cache_dtype=cache_dtype,
    )


def _group_ranks(parallel_state: Any) -> dict[str, dict[str, list[int]]]:
    """This rank's groups in each graph's layout (the report's record)."""
    groups = {}
    for name in parallel_state.layouts():
        parallel_state.activate(name)
        groups[name] = parallel_state.group_layout()
    return groups


# -- the parent ------------------------------------------------------------------


def _package_root() -> str:
    import autoport_cst

    return str(Path(autoport_cst.__file__).resolve().parents[1])


def _raise_rank_error(rank: int, result: dict[str, Any]) -> None:
    category, stage, message = result["category"], result["stage"], result["message"]
    if category == "checkpoint":
        raise RankCheckpointError(f"rank {rank}: {message}")
    if category == "port":
        raise PortFailure(
            stage, f"rank {rank}: {message}", bool(result.get("refusal")), result.get("raised_in")
        )
    if category == "input":
        raise InputError(f"rank {rank}: {message}")
    raise RuntimeError(f"TP rank {rank} failed ({stage}): {message}")


def run_port_ranks(
    model_dir: str | Path,
    checkpoint_dir: str | Path,
    dtype_name: str,
    scenario: Scenario,
    world_size: int,
    compute_teacher: Callable[[], list[list[int]]],
    ep_degree: int = 1,
    prefill: str = "auto",
    kv_cache_dtype: str = "auto",
    layout: ParallelLayout | None = None,
) -> tuple[list[PortOutput], str, dict[str, Any], list[list[int]]]:
    """Run the port on ``world_size`` ranks (with ``ep_degree`` expert
    partitions among them). Returns the per-rank outputs, the factory name,
    the stand-in description and the teacher tokens."""
    with tempfile.TemporaryDirectory(prefix="autoport-validate-") as tmp:
        job_path = Path(tmp) / "job.pkl"
        job = RankJob(
            world_size,
            _free_port(),
            str(model_dir),
            str(checkpoint_dir),
            dtype_name,
            scenario,
            ep_degree,
            prefill,
            kv_cache_dtype,
            layout,
            declared_rule(model_dir) if layout is None else None,
            _rank_default(model_dir, layout, scenario),
        )
        job_path.write_bytes(pickle.dumps(job))
        ranks = _start_ranks(job, job_path)
        try:
            try:
                teacher = compute_teacher()
            except Exception:
                # A rank's own load error (it names the parameter) explains
                # more than the reference's: prefer it when there is one.
                _raise_first_load_error(ranks, Path(tmp), world_size)
                raise
            payload = pickle.dumps(teacher)
            for rank in ranks:
                rank.send(payload)
            results = _collect(ranks, Path(tmp), world_size)
        finally:
            for rank in ranks:
                rank.stop()
    outputs = [results[r]["output"] for r in range(world_size)]
    return outputs, results[0]["factory"], results[0]["stand_in"], teacher


def _rank_default(model_dir: str | Path, layout: ParallelLayout | None, scenario: Scenario) -> str | None:
    """Where the reference declares ``rank=None``, for a run that asks for the
    rank-less forward check (``rankless_check``: embedding DP > 1, sampling off)."""
    if layout is None or layout.embedding_dp <= 1 or scenario.on_device_sampling:
        return None
    return rankless_check.declared_default(model_dir)


def _start_ranks(job: RankJob, job_path: Path) -> list:
    """Fork the ranks from this process, with what they import imported
    first, or start them as fresh interpreters (``rank_start``)."""
    if start_method() == "interpreter":
        return start_interpreter_ranks(job_path, job.world_size, _package_root())
    _preload_rank_modules(job)
    return start_forked_ranks(job_path, job.world_size, _rank_main)


def _preload_rank_modules(job: RankJob) -> None:
    """Import, in the parent, what a rank imports before its work: the
    collectives, the stand-in, the driver and the transformers configuration
    module of the checkpoint's architecture."""
    import torch.distributed  # noqa: F401

    from . import layout_session, package, standin  # noqa: F401
    from .driver import port_hf_config
    from .standin import checkpoints  # noqa: F401

    try:
        port_hf_config(job.checkpoint_dir, _DTYPES[job.dtype_name])
    except Exception:  # noqa: BLE001 - only a warm-up: a rank reports the error in its own terms
        pass


def _raise_first_load_error(ranks: list, directory: Path, world_size: int) -> None:
    deadline = time.monotonic() + WORKER_TIMEOUT_S
    pending = set(range(world_size))
    while pending and time.monotonic() < deadline:
        for rank in sorted(pending):
            result_path = directory / f"rank{rank}.pt"
            if result_path.exists():
                result = torch.load(result_path, weights_only=False)
                if result["kind"] == "error" and result["category"] in ("checkpoint", "port"):
                    _raise_rank_error(rank, result)
                pending.discard(rank)
            elif (directory / f"rank{rank}.loaded").exists() or ranks[rank].exit_code() is not None:
                pending.discard(rank)
        time.sleep(0.01)


def _collect(ranks: list, directory: Path, world_size: int) -> dict[int, dict]:
    """Wait for every rank; stop at the first error."""
    deadline = time.monotonic() + WORKER_TIMEOUT_S
    results: dict[int, dict] = {}
    while len(results) < world_size:
        for rank, process in enumerate(ranks):
            if rank in results:
                continue
            path = directory / f"rank{rank}.pt"
            if path.exists():
                result = torch.load(path, weights_only=False)
                if result["kind"] == "error":
                    _raise_rank_error(rank, result)
                results[rank] = result
            elif process.exit_code() is not None:
                raise RuntimeError(
                    f"TP rank {rank} exited with code {process.exit_code()} without a result\n"
                    + process.output_tail()
                )
        if len(results) < world_size:
            if time.monotonic() > deadline:
                raise RuntimeError(f"TP ranks did not finish within {WORKER_TIMEOUT_S:.0f} s")
            time.sleep(0.01)
    return results


def _merge_slices(per_rank: list[list[torch.Tensor]], full_rows: list[int]) -> list[torch.Tensor]:
    merged = []
    for index, rows in enumerate(full_rows):
        parts = [rank_rows[index] for rank_rows in per_rank]
        if parts[0].shape[0] == rows:
            merged.append(parts[0])
        elif sum(p.shape[0] for p in parts) == rows:
            merged.append(torch.cat(parts))
        else:
            merged.append(parts[0])  # the comparison reports the shape mismatch
    return merged


def merge_rank_outputs(outputs: list[PortOutput], scenario: Scenario) -> PortOutput:
    """One ``PortOutput`` with full rows: sequence-parallel prefill slices are
    concatenated in rank order; replicated outputs are taken from rank 0."""
    first = outputs[0]
    prompt_rows = [call.tokens for call in first.prefill_calls]
    sampled_rows = [len(call.sampled) for call in first.prefill_calls]
    decode_rows = [len(first.sequences) or scenario.batch] * scenario.steps
    prefill = {
        name: _merge_slices([o.prefill_records[name] for o in outputs], prompt_rows)
        for name in first.prefill_records
    }
    decode = {
        name: _merge_slices([o.decode_records[name] for o in outputs], decode_rows)
        for name in first.decode_records
    }
    timings = {key: max(o.timings.get(key, 0.0) for o in outputs) for key in first.timings}
    return PortOutput(
        prefill_logits=_merge_slices([o.prefill_logits for o in outputs], sampled_rows),
        decode_logits=_merge_slices([o.decode_logits for o in outputs], decode_rows),
        components=first.components,
        prefill_records=prefill,
        decode_records=decode,
        unexpected_keys=first.unexpected_keys,
        timings=timings,
        prefill_calls=first.prefill_calls,
        prefill_spans=first.prefill_spans,
        sequences=first.sequences,
        segmented=first.segmented,
        guarded_attributes=first.guarded_attributes,
        length_check=merged([o.length_check for o in outputs]),
        narrowed=distinct([entry for o in outputs for entry in o.narrowed]),
    )


def merge_layout_outputs(outputs: list[PortOutput], scenario: Scenario, layout: ParallelLayout) -> PortOutput:
    """One ``PortOutput`` for a run with data-parallel replicas: each
    replica's TP ranks merged (``merge_rank_outputs``), then the replicas'
    sequences, prefill calls and decode rows put together in replica order."""
    replicas = [
        merge_rank_outputs(outputs[d * layout.tp : (d + 1) * layout.tp], scenario) for d in range(layout.dp)
    ]
    first = replicas[0]
    steps = range(len(first.decode_logits))
    return PortOutput(
        prefill_logits=[t for r in replicas for t in r.prefill_logits],
        decode_logits=[torch.cat([r.decode_logits[j] for r in replicas]) for j in steps],
        components=first.components,
        prefill_records={
            n: [t for r in replicas for t in r.prefill_records[n]] for n in first.prefill_records
        },
        decode_records={
            n: [
                torch.cat([r.decode_records[n][j] for r in replicas])
                for j in range(len(first.decode_records[n]))
            ]
            for n in first.decode_records
        },
        unexpected_keys=first.unexpected_keys,
        timings={key: max(r.timings.get(key, 0.0) for r in replicas) for key in first.timings},
        prefill_calls=[c for r in replicas for c in r.prefill_calls],
        prefill_spans=[s for r in replicas for s in r.prefill_spans],
        sequences=[b for r in replicas for b in r.sequences],
        segmented=any(r.segmented for r in replicas),
        guarded_attributes=sorted({a for r in replicas for a in r.guarded_attributes}),
        rankless_check=rankless_check.merged([o.rankless_check for o in outputs]),
        narrowed=distinct([entry for r in replicas for entry in r.narrowed]),
    )


if __name__ == "__main__":
    sys.exit(_rank_main(Path(sys.argv[1]), int(sys.argv[2]), sys.stdin.buffer))
