"""Benchmark: ``autoport-cst port`` of a tiny model against the import floor.

Whole process, as a user runs it (interpreter start, imports, the work,
exit), in turn over ``--repeat`` rounds after ``--warmup`` uncounted ones,
so that each round sees the same load:

- the floor: a bare ``python -c "import torch, transformers"``;
- the model class: the same plus ``transformers.LlamaForCausalLM`` (the
  import of transformers' modeling code, which any validation against
  transformers pays: the config classes and ``modeling_utils`` bring in
  ``torch.distributed.tensor``, sympy, ``torch._dynamo`` and scipy);
- ``autoport-cst port CHECKPOINT --name bench_llama --out DIR --force`` on a
  tiny random ``LlamaForCausalLM`` checkpoint: research, apply, the tiny
  validation checkpoint, validation at TP=1 in fp32 and bf16 (a passing fp32
  run goes on to the reference's declared config variants and the four
  parallel layouts, on forked ranks), the config variant (its fp32 run goes
  on to the same) and the config guards.

Printed: the median wall and CPU time (user + sys of the process and its
children) of each, the median over the rounds of the per-round ratios port /
floor and port / model class (target: port <= 1.2x the floor, issue 18),
the port's own stage times of the last round, and the load average before
and after. On a shared machine wall time grows with the load and CPU time
much less: quote the CPU ratio, and compare figures of one run.

Usage: python benchmarks/port.py [--repeat N] [--warmup N]
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

TARGET_RATIO = 1.2  # port / bare import of torch + transformers (issue 18)
FLOOR = "bare import of torch + transformers"
MODEL_CLASS = "import of the model class"
PORT = "port (tiny LlamaForCausalLM)"

Run = tuple[float, float, int]  # wall s, CPU s, exit code


def _load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.1f} (1 min), {five:.1f} (5 min) on {os.cpu_count()} cores"


def timed(command: list[str]) -> tuple[Run, str]:
    """(wall s, CPU s of the process and its children, exit code) and what
    the command printed."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return (wall, cpu, done.returncode), done.stdout


def commands(checkpoint: Path, out: Path) -> dict[str, list[str]]:
    python = sys.executable
    return {
        FLOOR: [python, "-c", "import torch, transformers"],
        MODEL_CLASS: [python, "-c", "import torch, transformers; transformers.LlamaForCausalLM"],
        PORT: [
            *(python, "-m", "autoport_cst", "port", str(checkpoint)),
            *("--name", "bench_llama", "--out", str(out), "--force"),
        ],
    }


def whole_process(checkpoint: Path, out: Path, repeat: int, warmup: int) -> tuple[dict[str, list[Run]], str]:
    """Every command in turn, ``warmup`` rounds not counted, then ``repeat``
    counted; the port's output of the last round."""
    runs: dict[str, list[Run]] = {name: [] for name in commands(checkpoint, out)}
    printed = ""
    for round_ in range(warmup + repeat):
        for name, command in commands(checkpoint, out).items():
            run, output = timed(command)
            if round_ >= warmup:
                runs[name].append(run)
            if name == PORT:
                printed = output
    return runs, printed


def report(runs: dict[str, list[Run]]) -> bool:
    """The medians and the per-round ratios; True when the port meets the
    target in CPU time and every port run exited 0."""
    print(f"  {'':<36} {'wall s':>7} {'CPU s':>7}  exit codes")
    for name, measured in runs.items():
        wall = statistics.median(m[0] for m in measured)
        cpu = statistics.median(m[1] for m in measured)
        print(f"  {name:<36} {wall:7.2f} {cpu:7.2f}  {sorted({m[2] for m in measured})}")

    met = _median_ratio(runs, PORT, FLOOR, 1) <= TARGET_RATIO
    verdict = f"(target <= {TARGET_RATIO}x in CPU time: {'met' if met else 'MISSED'})"
    for over, under, label in (
        (PORT, FLOOR, "port / bare import"),
        (PORT, MODEL_CLASS, "port / import of the model class"),
        (MODEL_CLASS, FLOOR, "model class / bare import"),
    ):
        cpu, wall = _median_ratio(runs, over, under, 1), _median_ratio(runs, over, under, 0)
        judged = f" {verdict}" if (over, under) == (PORT, FLOOR) else ""
        print(f"  {label}: CPU {cpu:.2f}x, wall {wall:.2f}x{judged}")
    return met and all(m[2] == 0 for m in runs[PORT])


def _median_ratio(runs: dict[str, list[Run]], over: str, under: str, index: int) -> float:
    """The median over the rounds of ``over`` / ``under`` (wall: index 0, CPU: 1)."""
    return statistics.median(a[index] / b[index] for a, b in zip(runs[over], runs[under], strict=True))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="counted rounds")
    parser.add_argument("--warmup", type=int, default=1, help="rounds run first and not counted")
    args = parser.parse_args()
    print(_load())
    from autoport_cst.validate import build_tiny_checkpoint

    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = build_tiny_checkpoint("LlamaForCausalLM", Path(tmp) / "tiny", seed=1).directory
        runs, printed = whole_process(checkpoint, Path(tmp) / "out", args.repeat, args.warmup)
    print(f"\nwhole process, {args.repeat} rounds after {args.warmup} not counted; medians")
    ok = report(runs)
    stages = [line for line in printed.splitlines() if line.startswith("total ")]
    print(f"  the port's stages (last round, wall): {stages[-1] if stages else '(no total line)'}")
    print(_load())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
