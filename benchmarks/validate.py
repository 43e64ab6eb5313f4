"""Benchmark: validating a tiny model, compute only and whole process.

Validates the llama3 reference against a tiny LlamaForCausalLM checkpoint
(prefill of the default prompts plus 16 decode steps). Two kinds of figure,
both printed:

- compute only: ``validate_model`` called in this process once torch,
  transformers and the modeling code are imported (the validation itself:
  reference, port build and load, prefill, decode, comparison; at TP=2 also
  starting the rank processes), at TP=1 and TP=2 in fp32 and bf16;
- whole process: ``autoport-cst validate PORT --hf CHECKPOINT [--tp 2]`` as
  a user runs it (interpreter start, imports, validation, exit): wall time
  and CPU time (the process and its ranks), side by side with a bare
  ``python -c "import torch, transformers"``, interleaved over ``--repeat``
  rounds. The median of each, and the ratios TP=2 / TP=1 (target <= 1.3) and
  TP=1 / bare import;
- multi-latent attention: one decode step on the stand-in, absorbed (the
  deepseek_v3 reference's decode) and expanded, at the tiny DeepSeek-V3
  checkpoint's sizes (benchmarks/mla_decode.py); absorbed must not be slower.

The load average is printed before and after: on a shared machine wall times
grow with the load and CPU times much less; compare figures of one run.
Peak memory is the maximum resident set size of this process and of the
largest child (a rank or a whole-process run).

Usage: python benchmarks/validate.py [--repeat N]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

LLAMA3 = ROOT / "reference_models" / "llama3"
TARGET_TP1_S = 5.0  # compute only
TARGET_TP2_RATIO = 1.3  # whole process, TP=2 / TP=1 wall


def _peak_mib(who: int) -> float:
    return resource.getrusage(who).ru_maxrss / 1024.0  # Linux reports KiB


def _load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.1f} (1 min), {five:.1f} (5 min) on {os.cpu_count()} cores"


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(command: list[str], env: dict[str, str] | None = None) -> tuple[float, float, int]:
    """(wall s, CPU s of the process and its children, exit code)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    code = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env).returncode
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), code


def compute_only(checkpoint: Path, repeat: int) -> list[tuple]:
    from autoport_cst.validate import validate_model

    rows = []
    for tp in (1, 2):
        for dtype in ("fp32", "bf16"):
            times, cpus = [], []
            for _ in range(repeat):
                began, cpu = time.perf_counter(), time.process_time() + _children_cpu()
                report = validate_model(LLAMA3, checkpoint, tp=tp, dtype=dtype, steps=16)
                times.append(time.perf_counter() - began)
                cpus.append(time.process_time() + _children_cpu() - cpu)
            rows.append((tp, dtype, times[0], min(times), min(cpus), report.equivalent, report.timings))
    print(f"\ncompute only, in this process   {_load()}")
    header = f"{'tp':>3} {'dtype':>5} {'first s':>8} {'best s':>7} {'CPU s':>6}  verdict"
    print(f"{header}     breakdown of the last run (s)")
    for tp, dtype, first, best, cpu, equivalent, timings in rows:
        parts = ", ".join(f"{k}={v:.2f}" for k, v in timings.items() if k != "total")
        verdict = "equivalent" if equivalent else "DIVERGES  "
        print(f"{tp:>3} {dtype:>5} {first:8.2f} {best:7.2f} {cpu:6.2f}  {verdict}  {parts}")
    return rows


def whole_process(checkpoint: Path, repeat: int) -> dict[str, list[tuple[float, float, int]]]:
    validate = [sys.executable, "-m", "autoport_cst", "validate", str(LLAMA3), "--hf", str(checkpoint)]
    fresh = {**os.environ, "AUTOPORT_CST_RANK_START": "interpreter"}
    commands = {
        "bare import of torch + transformers": ([sys.executable, "-c", "import torch, transformers"], None),
        "validate TP=1": (validate, None),
        "validate TP=2": ([*validate, "--tp", "2"], None),
        "validate TP=2, fresh-interpreter ranks": ([*validate, "--tp", "2"], fresh),
    }
    runs: dict[str, list[tuple[float, float, int]]] = {name: [] for name in commands}
    for _ in range(repeat):  # interleaved: each round sees the same load
        for name, (command, env) in commands.items():
            runs[name].append(timed(command, env))
    print(f"\nwhole process, median of {repeat}   {_load()}")
    print(f"  {'':<40} {'wall s':>7} {'CPU s':>7}  exit codes")
    for name, measured in runs.items():
        wall = statistics.median(m[0] for m in measured)
        cpu = statistics.median(m[1] for m in measured)
        print(f"  {name:<40} {wall:7.2f} {cpu:7.2f}  {sorted({m[2] for m in measured})}")
    return runs


def ratios(runs: dict[str, list[tuple[float, float, int]]]) -> bool:
    def median(name: str, index: int) -> float:
        return statistics.median(m[index] for m in runs[name])

    bare, tp1, tp2 = "bare import of torch + transformers", "validate TP=1", "validate TP=2"
    wall_ratio, cpu_ratio = median(tp2, 0) / median(tp1, 0), median(tp2, 1) / median(tp1, 1)
    met = wall_ratio <= TARGET_TP2_RATIO
    print(
        f"  TP=2 / TP=1: wall {wall_ratio:.2f}x, CPU {cpu_ratio:.2f}x "
        f"(target <= {TARGET_TP2_RATIO}x wall: {'met' if met else 'MISSED'})"
    )
    print(
        f"  TP=1 / bare import: wall {median(tp1, 0) / median(bare, 0):.2f}x, CPU {median(tp1, 1) / median(bare, 1):.2f}x"
    )
    return met and all(m[2] == 0 for name in (tp1, tp2) for m in runs[name])


def mla_decode(repeat: int) -> bool:
    """One decode step of multi-latent attention on the stand-in at the tiny
    DeepSeek-V3 checkpoint's sizes (benchmarks/mla_decode.py, one intra-op
    thread as validation runs): absorbed (what the deepseek_v3 reference
    decodes with) and expanded, both printed; True when absorbed is not slower."""
    import importlib.util

    import torch

    spec = importlib.util.spec_from_file_location(
        "mla_decode_benchmark", ROOT / "benchmarks" / "mla_decode.py"
    )
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules[spec.name] = module  # type: ignore[union-attr]  # its dataclass looks its module up there
    threads = torch.get_num_threads()
    try:
        spec.loader.exec_module(module)  # type: ignore[union-attr]
        torch.set_num_threads(1)
        tiny = module.SIZES[0]
        absorbed_ms, expanded_ms, difference = module.measure(tiny, max(repeat, 5))
    finally:
        torch.set_num_threads(threads)
        sys.modules.pop("mla_decode_benchmark", None)
    met = absorbed_ms <= expanded_ms
    print(
        f"\nmulti-latent attention decode step, tiny DeepSeek-V3 sizes ({tiny.heads} heads, latent {tiny.rank} + "
        f"rope {tiny.rope}, batch {tiny.batch}, {tiny.context} tokens), median of {max(repeat, 5)}: "
        f"absorbed {absorbed_ms:.3f} ms, expanded {expanded_ms:.3f} ms, expanded / absorbed "
        f"{expanded_ms / absorbed_ms:.2f}x (absorbed not slower: {'met' if met else 'MISSED'}; outputs differ by "
        f"{difference:.1e})"
    )
    return met


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="runs per configuration")
    args = parser.parse_args()
    print(_load())
    start = time.perf_counter()
    import torch  # noqa: F401
    import transformers  # noqa: F401
    from transformers import LlamaForCausalLM  # noqa: F401  (modeling import, part of start-up)

    from autoport_cst.validate import build_tiny_checkpoint

    print(f"start-up imports (not in the compute-only figures): {time.perf_counter() - start:.2f} s")
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = build_tiny_checkpoint("LlamaForCausalLM", Path(tmp) / "tiny", seed=0).directory
        rows = compute_only(checkpoint, args.repeat)
        runs = whole_process(checkpoint, args.repeat)
    ok = ratios(runs)
    ok &= mla_decode(args.repeat)
    print(
        f"peak RSS: this process {_peak_mib(resource.RUSAGE_SELF):.0f} MiB, "
        f"largest child {_peak_mib(resource.RUSAGE_CHILDREN):.0f} MiB"
    )
    tp1 = max(row[2] for row in rows if row[0] == 1)
    print(
        f"TP=1 compute only, slowest first run: {tp1:.2f} s ({'meets' if tp1 < TARGET_TP1_S else 'MISSES'} the {TARGET_TP1_S:.0f} s target)"
    )
    return 0 if ok and all(row[5] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
