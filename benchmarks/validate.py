"""Benchmark: wall time and peak memory of validating a tiny model.

Validates the llama3 reference against a tiny LlamaForCausalLM checkpoint
(prefill of 3 prompts plus 16 decode steps) at TP=1 and TP=2, in fp32 and
bf16. Start-up (interpreter, torch and transformers imports) is measured
separately and excluded from the validation times. Peak memory is the
maximum resident set size (ru_maxrss) of this process and, for TP=2, of the
rank processes.

Usage: python benchmarks/validate.py [--repeat N]
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

TARGET_TP1_S = 5.0


def _peak_mib(who: int) -> float:
    return resource.getrusage(who).ru_maxrss / 1024.0  # Linux reports KiB


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=1, help="runs per configuration (best is reported)")
    args = parser.parse_args()

    start = time.perf_counter()
    import torch  # noqa: F401
    import transformers  # noqa: F401
    from transformers import LlamaForCausalLM  # noqa: F401  (modeling import, part of start-up)

    from autoport_cst.validate import build_tiny_checkpoint, validate_model

    startup = time.perf_counter() - start
    print(f"start-up imports (excluded): {startup:.2f} s")

    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = build_tiny_checkpoint("LlamaForCausalLM", Path(tmp) / "tiny", seed=0).directory
        rows = []
        for tp in (1, 2):
            for dtype in ("fp32", "bf16"):
                times = []
                for _ in range(args.repeat):
                    began = time.perf_counter()
                    report = validate_model(
                        ROOT / "reference_models" / "llama3", checkpoint, tp=tp, dtype=dtype, steps=16
                    )
                    times.append(time.perf_counter() - began)
                rows.append((tp, dtype, times[0], min(times), report.equivalent, report.timings))
        peak_self = _peak_mib(resource.RUSAGE_SELF)
        peak_children = _peak_mib(resource.RUSAGE_CHILDREN)

    print(f"{'tp':>3} {'dtype':>5} {'first s':>8} {'best s':>7}  verdict     breakdown of the last run (s)")
    for tp, dtype, first, best, equivalent, timings in rows:
        parts = ", ".join(f"{k}={v:.2f}" for k, v in timings.items() if k != "total")
        print(
            f"{tp:>3} {dtype:>5} {first:8.2f} {best:7.2f}  {'equivalent' if equivalent else 'DIVERGES  '}  {parts}"
        )
    print(f"peak RSS: this process {peak_self:.0f} MiB, largest TP rank process {peak_children:.0f} MiB")
    tp1 = max(first for tp, _d, first, _b, _e, _t in rows if tp == 1)
    verdict = "meets" if tp1 < TARGET_TP1_S else "MISSES"
    print(f"TP=1 slowest first run: {tp1:.2f} s ({verdict} the {TARGET_TP1_S:.0f} s target)")
    return 0 if all(row[4] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
