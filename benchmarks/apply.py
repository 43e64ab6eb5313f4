"""Wall time of `apply` with the six foundation codemods on the llama3 reference.

The plan realizes a diff with swap-norm and add-qkv-bias, renames the classes,
and runs lazy-rope and unsqueeze-decode-biases as explicit steps (both leave
the lazy, 2-D-bias llama3 reference as it is, but still parse and traverse
every model file). float32-router needs an MoE router, which a dense reference
does not have, so it is timed separately on the MoE fixture
`fixtures/moe_router.py`.

Run: python benchmarks/apply.py [--repeat N]
Target: apply under 1 s on a 2-core machine.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PLAN = {
    "version": 1,
    "name": "bench_model",
    "class_prefix": "BenchModel",
    "architecture": "BenchModelForCausalLM",
    "reference": "llama3",
    "spec": {
        "norm": {"kind": "layernorm", "bias": True, "eps_key": "layer_norm_eps"},
        "attention": {"qkv_bias": True, "o_bias": True},
        "rope": {"type": "default"},
    },
    "steps": [{"codemod": "lazy-rope"}, {"codemod": "unsqueeze-decode-biases"}],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()

    start = time.perf_counter()
    from autoport_cst.apply import build_port, load_reference, write_port
    from autoport_cst.plan import parse_plan
    from autoport_cst.transform.base import run_on_source
    from autoport_cst.transform.library import get_codemod, library

    library()
    imports = time.perf_counter() - start

    plan = parse_plan(PLAN)
    timings = []
    for _ in range(args.repeat):
        with tempfile.TemporaryDirectory() as out:
            t0 = time.perf_counter()
            reference = load_reference("llama3")
            result = build_port(plan, reference)
            assert result.ok, result.failure
            write_port(Path(out), result.files, result.package_dir, force=False)
            timings.append(time.perf_counter() - t0)
    steps = [s.codemod for s in result.steps]

    router_source = (ROOT / "fixtures" / "moe_router.py").read_text()
    router = get_codemod("float32-router")()
    router_times = []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        run_on_source(router, router_source, "moe_router.py", "model")
        router_times.append(time.perf_counter() - t0)

    lines = sum(text.count("\n") for text in reference.files.values())
    print(f"reference llama3: {len(reference.files)} files, {lines} lines")
    print(f"steps: {', '.join(steps)}")
    print(f"imports (libcst, codemod library): {imports:.3f} s")
    print(
        f"apply (load, compose, transform, post-check, write): "
        f"min {min(timings):.3f} s, median {statistics.median(timings):.3f} s over {args.repeat} runs"
    )
    print(
        f"float32-router on fixtures/moe_router.py: min {min(router_times) * 1000:.1f} ms, "
        f"median {statistics.median(router_times) * 1000:.1f} ms"
    )
    verdict = "met" if min(timings) + imports < 1.0 else "MISSED"
    print(f"target: apply under 1 s including imports: {verdict} ({min(timings) + imports:.3f} s)")


if __name__ == "__main__":
    main()
