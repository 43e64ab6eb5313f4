"""Speed of ``apply`` against LibCST's bare parse of the files it transforms.

    python benchmarks/apply.py [--rounds 7] [--repeat 5] [--only NAME] [--before SRC]

Three ports, each on the reference it names:

- ``llama3-bench``: the llama3 reference (the real-structure package) ported
  with swap-norm and add-qkv-bias from the architecture diff, rename-classes,
  and lazy-rope and unsqueeze-decode-biases as explicit steps (both leave the
  lazy, 2-D-bias llama3 reference as it is, but read every model file);
- ``qwen2`` and ``gemma2``: the example plans (4 and 11 steps on llama3).

Whole process: ``autoport-cst apply --plan P --out TMP --force`` (as run from
a shell, summary included, output discarded) side by side with a fresh
interpreter that imports LibCST and parses the reference's Python files
(``python -c "import libcst; [libcst.parse_module(...) for f in FILES]"``),
in turn, A B A B ..., after one warm-up run of each (which also writes the
bytecode caches). Printed: medians of CPU (user + sys) and wall seconds, and
the median of the per-round ratios A/B. Targets, judged on CPU time (wall
time on a shared machine counts the other processes' load): at most 2x the
bare parse for ``llama3-bench`` (issue 11, the real-structure llama3) and 1.5x
for the example plans (issue 18).

In process (CPU time): ``build_port`` (compose, transform, census,
post-checks; the imports and the codemods loaded before) and ``write_port``,
against ``libcst.parse_module`` of the same files in this process: best and
median.
The machine's other load is not controlled (its load average is printed):
compare figures of the same run.

``--before SRC``: the ``src`` directory of earlier code (a copy of the tree
before a change), whose ``apply`` runs in the same rounds, A B C A B C ...,
its ratio to the same bare parses printed beside the current code's: a
before/after comparison under one load. The codemods and the references sit
beside ``src`` (``SRC/../codemods``, ``SRC/../reference_models``) and an
editable install maps ``autoport_cst.codemods`` to this checkout's, so the
earlier code runs from a copy of ``SRC/autoport_cst`` with its own two linked
in, first on ``PYTHONPATH``; the benchmark checks that the earlier process
imports them from there, and stops otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGETS = {"llama3-bench": 2.0, "qwen2": 1.5, "gemma2": 1.5}  # apply / bare parse, whole process, CPU

BENCH_PLAN = {
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


def plans(directory: Path) -> dict[str, Path]:
    bench = directory / "llama3-bench.plan.json"
    bench.write_text(json.dumps(BENCH_PLAN, indent=2))
    return {
        "llama3-bench": bench,
        "qwen2": ROOT / "examples" / "qwen2.plan.json",
        "gemma2": ROOT / "examples" / "gemma2.plan.json",
    }


def reference_files(plan: Path) -> list[Path]:
    """The reference's Python files apply parses (package and companions)."""
    from autoport_cst.apply import load_reference

    reference = load_reference(json.loads(plan.read_text())["reference"])
    files = [reference.directory / rel for rel in reference.files]
    own = [reference.directory / "companions" / name for name in reference.companions]
    files += [f for f in own if f.is_file()]  # the others are made from a template (companion_templates)
    return sorted(f for f in files if f.suffix == ".py")


def run(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(CPU s, wall s) of one process; it must succeed."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(
        cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), wall


def earlier_env(env: dict[str, str], src: Path, into: Path) -> dict[str, str]:
    """The environment that runs the earlier code of ``src`` whole: its
    package, codemods and references (see ``--before``), checked by import."""
    if not (src / "autoport_cst").is_dir():
        sys.exit(
            f"--before {src}: no autoport_cst package there (give the src directory of a copy of the tree)"
        )
    tree = src.resolve().parent
    package = into / "autoport_cst"
    shutil.copytree(
        src / "autoport_cst", package, symlinks=True, ignore=shutil.ignore_patterns("__pycache__")
    )
    for name in ("codemods", "reference_models"):
        if not (package / name).exists():
            (package / name).symlink_to(tree / name, target_is_directory=True)
    earlier = dict(env, PYTHONPATH=os.pathsep.join(filter(None, [str(into), env.get("PYTHONPATH")])))
    probe = "import autoport_cst.codemods as c, autoport_cst.reference_models as r; print(c.__path__[0], r.__path__[0])"
    found = subprocess.run([sys.executable, "-c", probe], env=earlier, capture_output=True, text=True)
    expected = f"{package / 'codemods'} {package / 'reference_models'}"
    if found.returncode != 0 or found.stdout.strip() != expected:
        sys.exit(
            f"--before {src}: the earlier code imports {found.stdout.strip() or found.stderr.strip()}, not {expected}"
        )
    return earlier


def whole_process(
    plan: Path, files: list[Path], out: Path, rounds: int, before: Path | None = None
) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    apply = [sys.executable, "-m", "autoport_cst", "apply", "--plan", str(plan), "--out", str(out), "--force"]
    earlier = earlier_env(env, before, out.parent / "earlier") if before is not None else env
    parse = [
        sys.executable,
        "-c",
        "import sys, libcst; [libcst.parse_module(open(f, encoding='utf-8').read()) for f in sys.argv[1:]]",
        *map(str, files),
    ]
    run(apply, env), run(parse, env)  # warm-up: bytecode caches, file cache
    if before is not None:
        run(apply, earlier)
    a_cpu, a_wall, b_cpu, b_wall, cpu_ratio, wall_ratio, c_cpu, c_ratio = [], [], [], [], [], [], [], []
    for _ in range(rounds):
        (ac, aw), (bc, bw) = run(apply, env), run(parse, env)
        a_cpu.append(ac), a_wall.append(aw), b_cpu.append(bc), b_wall.append(bw)
        cpu_ratio.append(ac / bc), wall_ratio.append(aw / bw)
        if before is not None:
            cc = run(apply, earlier)[0]
            c_cpu.append(cc), c_ratio.append(cc / bc)
    median = statistics.median
    figures = {
        "apply_cpu": median(a_cpu),
        "apply_wall": median(a_wall),
        "parse_cpu": median(b_cpu),
        "parse_wall": median(b_wall),
        "cpu_ratio": median(cpu_ratio),
        "wall_ratio": median(wall_ratio),
    }
    if before is not None:
        figures.update(before_cpu=median(c_cpu), before_ratio=median(c_ratio))
    return figures


def in_process(plan_path: Path, files: list[Path], out: Path, repeat: int) -> dict[str, float]:
    import libcst

    from autoport_cst.apply import build_port, load_reference, write_port
    from autoport_cst.plan import load_plan

    plan = load_plan(plan_path)
    reference = load_reference(plan.reference or "llama3")
    texts = [f.read_text(encoding="utf-8") for f in files]
    result = build_port(plan, reference)  # the codemod library and the lint rules imported
    assert result.ok, result.failure
    builds, writes, parses = [], [], []
    for _ in range(repeat):
        start = time.process_time()
        result = build_port(plan, reference)
        middle = time.process_time()
        write_port(out, result.files, result.package_dir, force=True)
        end = time.process_time()
        builds.append(middle - start), writes.append(end - middle)
        start = time.process_time()
        for text in texts:
            libcst.parse_module(text)
        parses.append(time.process_time() - start)
    return {
        "steps": len(result.steps),
        "build_min": min(builds),
        "build_median": statistics.median(builds),
        "write_median": statistics.median(writes),
        "parse_min": min(parses),
        "parse_median": statistics.median(parses),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7, help="whole-process rounds (A and B each)")
    parser.add_argument("--repeat", type=int, default=5, help="in-process repetitions")
    parser.add_argument("--only", help="one of llama3-bench, qwen2, gemma2")
    parser.add_argument("--before", type=Path, help="src directory of earlier code, run in the same rounds")
    args = parser.parse_args()

    one, five, _ = os.getloadavg()
    print(f"load average {one:.1f} (1 min), {five:.1f} (5 min) on {os.cpu_count()} cores")
    verdicts = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, plan in plans(Path(tmp)).items():
            if args.only and name != args.only:
                continue
            files = reference_files(plan)
            lines = sum(f.read_text(encoding="utf-8").count("\n") for f in files)
            whole = whole_process(plan, files, Path(tmp) / "whole", args.rounds, args.before)
            inner = in_process(plan, files, Path(tmp) / "inner", args.repeat)
            target = TARGETS[name]
            verdict = "met" if whole["cpu_ratio"] <= target else "MISSED"
            verdicts.append(verdict)
            print(f"\n{name}: {inner['steps']} steps; {len(files)} reference files, {lines} lines")
            print(
                f"  whole process, median of {args.rounds}: apply {whole['apply_cpu']:.2f} s CPU "
                f"({whole['apply_wall']:.2f} s wall); bare parse {whole['parse_cpu']:.2f} s CPU "
                f"({whole['parse_wall']:.2f} s wall)"
            )
            print(
                f"  ratio apply / parse: {whole['cpu_ratio']:.2f}x CPU ({whole['wall_ratio']:.2f}x wall); "
                f"target <= {target}x CPU: {verdict}"
            )
            if args.before is not None:
                print(
                    f"  earlier code ({args.before}), same rounds: apply {whole['before_cpu']:.2f} s CPU, "
                    f"ratio {whole['before_ratio']:.2f}x CPU"
                )
            print(
                f"  in process, CPU: build_port {inner['build_min']:.3f} s best, {inner['build_median']:.3f} s "
                f"median (write_port {inner['write_median']:.3f} s); parse {inner['parse_min']:.3f} s best, "
                f"{inner['parse_median']:.3f} s median: {inner['build_median'] / inner['parse_median']:.1f}x"
            )
    print(f"\ntargets (whole process, CPU): {'met' if all(v == 'met' for v in verdicts) else 'MISSED'}")


if __name__ == "__main__":
    main()
