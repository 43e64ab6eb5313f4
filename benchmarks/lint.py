"""Lint performance, side by side on the same files.

    python benchmarks/lint.py [--sample 300] [--skip-fixit] [--skip-full] [--fixit PATH]

Over a fixed sample of the installed transformers ``models/`` directory (every
k-th file of the sorted list, the same files for all three tools):

- ``autoport-cst lint`` cold (no cache), end to end in a subprocess, with its
  process pool and with ``-j 1``: wall time and files/s;
- LibCST's bare ``parse_module`` of the same files, in one process;
- ``fixit lint`` with its default rules.

Then, over the whole directory: a cold run that fills a cache in a temporary
directory, and the warm re-run. Finally one 500-line file
(``llama/modeling_llama.py``) end to end, start-up included.

Targets (issue 3): at least 8x Fixit's throughput; within 3x of bare LibCST
parse time; warm re-run under 5 s; a 500-line file under 0.5 s. Every figure
is printed as measured, with PASS or MISS. The one-file figures are printed
both ways: whole process (wall and CPU, interpreter start and imports
included) and compute only (``lint_source`` in this process). The machine's
other load is not controlled (its load average is printed): compare figures
from the same run.

The sample is copied to a temporary directory first (Fixit skips files under
site-packages). Fixit is run from its own virtual environment (created on first use under
~/.cache/autoport-cst-bench/fixit-venv), because installing it next to this
project downgrades click below what other installed packages require.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXIT_VENV = Path.home() / ".cache" / "autoport-cst-bench" / "fixit-venv"


def models_dir() -> Path:
    spec = importlib.util.find_spec("transformers")  # no import of transformers
    if spec is None or not spec.submodule_search_locations:
        sys.exit("transformers is not installed: nothing to benchmark on")
    return Path(list(spec.submodule_search_locations)[0]) / "models"


def _version(distribution: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(distribution)
    except PackageNotFoundError:
        return "?"


def python_files(directory: Path) -> list[Path]:
    out = []
    for root, dirs, files in os.walk(directory):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__" and not d.startswith("."))
        out += [Path(root) / f for f in sorted(files) if f.endswith(".py")]
    return sorted(out)


def sample(files: list[Path], size: int) -> list[Path]:
    step = max(1, len(files) // size)
    return files[::step][:size]


def timed(cmd: list[str], cwd: Path, env: dict | None = None) -> tuple[float, float, int, str]:
    """(wall s, CPU s of the process and its children, return code, stderr tail)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    tail = (proc.stderr or "").strip().splitlines()[-1:] or [""]
    return wall, cpu, proc.returncode, tail[0]


def load_average() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.1f} (1 min), {five:.1f} (5 min) on {os.cpu_count()} cores"


def lint_compute(path: Path, runs: int = 5) -> tuple[float, float]:
    """Best in-process wall and CPU time of linting one file, the imports done before."""
    from autoport_cst.lint import lint_source

    text = path.read_text(encoding="utf-8")
    lint_source(text, path=str(path))  # imports and the rule registry, not timed
    times, cpus = [], []
    for _ in range(runs):
        start, cpu = time.perf_counter(), time.process_time()
        lint_source(text, path=str(path))
        times.append(time.perf_counter() - start)
        cpus.append(time.process_time() - cpu)
    return min(times), min(cpus)


def fixit_command(explicit: str | None) -> list[str] | None:
    if explicit:
        return [explicit]
    python = FIXIT_VENV / "bin" / "python"
    if not python.exists():
        print(f"creating a virtual environment for Fixit in {FIXIT_VENV} ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(FIXIT_VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "fixit"], check=True)
    probe = subprocess.run(
        [
            str(python),
            "-c",
            "import fixit, libcst; print(fixit.__version__, "
            "libcst.__version__ if hasattr(libcst, '__version__') else '?')",
        ],
        capture_output=True,
        text=True,
    )
    if probe.returncode != 0:
        return None
    print(f"fixit {probe.stdout.split()[0]} (its own venv)")
    return [str(python), "-m", "fixit"]


def row(name: str, files: int, wall: float, cpu: float | None = None, note: str = "") -> None:
    rate = files / wall if wall else float("inf")
    cpu_text = f"{cpu:8.1f}" if cpu is not None else "       -"
    print(f"  {name:<38} {files:>6} {wall:9.2f} {cpu_text} {rate:9.1f}  {note}")


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def main() -> int:
    args = arguments()
    models = models_dir()
    every = python_files(models)
    chosen = sample(every, args.sample)
    lines = sum(p.read_bytes().count(b"\n") for p in chosen)
    print(f"corpus: {models} ({len(every)} files); sample: {len(chosen)} files, {lines} lines")
    print(
        f"python {sys.version.split()[0]}, libcst {_version('libcst')}, "
        f"{os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.2f}"
    )
    work = Path(tempfile.mkdtemp(prefix="autoport-lint-bench-"))
    env = {**os.environ, "AUTOPORT_CST_CACHE_DIR": str(work / "cache")}
    ours = [sys.executable, "-m", "autoport_cst", "lint", "--exit-zero", "--output-format", "json"]
    names = copy_sample(chosen, models, work)
    side_by_side(names, work, env, ours, args)
    if not args.skip_full:
        whole_directory(models, len(every), work, env, ours)
    one_file(models / "llama" / "modeling_llama.py", work, env)
    shutil.rmtree(work, ignore_errors=True)
    return 0


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sample", type=int, default=300, help="files in the side-by-side sample")
    parser.add_argument("--skip-fixit", action="store_true")
    parser.add_argument("--skip-full", action="store_true", help="skip the whole-directory runs")
    parser.add_argument("--fixit", help="a fixit executable to use instead of the private venv")
    return parser.parse_args()


def copy_sample(chosen: list[Path], models: Path, work: Path) -> list[str]:
    """Copies of the sample under ``work`` (Fixit skips files under
    site-packages: all three tools read the copies), relative to ``work``."""
    copies = work / "sample"
    names = []
    for path in chosen:
        target = copies / path.relative_to(models)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
        names.append(str(target.relative_to(work)))
    return names


def side_by_side(names: list[str], work: Path, env: dict, ours: list[str], args: argparse.Namespace) -> None:
    """Bare parse, our lint cold (pool and -j 1) and Fixit on the sample, then the targets."""
    import libcst

    chosen = [work / n for n in names]
    print("\nside by side on the sample            files    wall s    CPU s   files/s")
    start = time.perf_counter()  # bare parse, one process
    for path in chosen:
        libcst.parse_module(path.read_bytes())
    parse_wall = time.perf_counter() - start
    row("LibCST parse_module (1 process)", len(chosen), parse_wall, parse_wall)

    our_wall, our_cpu, rc, tail = timed([*ours, "--no-cache", *names], work, env)
    row("autoport-cst lint, cold (pool)", len(chosen), our_wall, our_cpu, tail[:60])
    one_wall, one_cpu, _, _ = timed([*ours, "--no-cache", "-j", "1", *names], work, env)
    row("autoport-cst lint, cold, -j 1", len(chosen), one_wall, one_cpu)

    fixit_wall = None
    if not args.skip_fixit:
        command = fixit_command(args.fixit)
        if command is None:
            print("  fixit: not available")
        else:
            fixit_wall, fixit_cpu, frc, ftail = timed([*command, "lint", *names], work)
            row("fixit lint (default rules)", len(chosen), fixit_wall, fixit_cpu, f"rc {frc}; {ftail[:50]}")

    print("\ntargets")
    if fixit_wall:
        ratio = fixit_wall / our_wall
        print(f"  throughput vs Fixit: {ratio:5.1f}x (target >= 8x)          {verdict(ratio >= 8)}")
    ratio = our_wall / parse_wall
    print(f"  cold wall vs bare parse: {ratio:4.2f}x (target <= 3x)         {verdict(ratio <= 3)}")
    ratio_one = one_wall / parse_wall
    print(f"  cold wall -j 1 vs bare parse: {ratio_one:4.2f}x (one core, start-up included)")


def whole_directory(models: Path, files: int, work: Path, env: dict, ours: list[str]) -> None:
    """A cold run over every file that fills the cache, and the warm re-run."""
    cold_wall, cold_cpu, _, tail = timed([*ours, str(models)], work, env)
    row("\n  whole directory, cold (fills cache)", files, cold_wall, cold_cpu, tail[:60])
    warm_wall, warm_cpu, _, tail = timed([*ours, str(models)], work, env)
    row("whole directory, warm (cache)", files, warm_wall, warm_cpu, tail[:60])
    print(f"  warm re-run: {warm_wall:.2f} s (target < 5 s)              {verdict(warm_wall < 5)}")


def one_file(path: Path, work: Path, env: dict) -> None:
    """One file end to end (start-up included, both entry points), and compute only."""
    size = path.read_bytes().count(b"\n")
    results = {}
    print(f"\none {size}-line file ({path.name}), {load_average()}")
    for label, cmd in (
        ("python -m autoport_cst lint", [sys.executable, "-m", "autoport_cst", "lint", "--no-cache"]),
        ("autoport-cst lint", [shutil.which("autoport-cst") or "autoport-cst", "lint", "--no-cache"]),
    ):
        runs = [timed([*cmd, str(path)], work, env)[:2] for _ in range(5)]
        walls = sorted(wall for wall, _ in runs)
        results[label] = walls[0]
        print(
            f"  whole process, {label:<28} wall min {walls[0]:.3f} s, median {walls[2]:.3f} s; "
            f"CPU median {sorted(cpu for _, cpu in runs)[2]:.3f} s"
        )
    wall, cpu = lint_compute(path)
    print(
        f"  compute only (lint_source in this process, imports excluded): wall min {wall:.3f} s, CPU min {cpu:.3f} s"
    )
    best = min(results.values())
    print(f"  500-line file, whole process: {best:.3f} s (target < 0.5 s)     {verdict(best < 0.5)}")


if __name__ == "__main__":
    sys.exit(main())
