"""Linting many files: discovery, configuration per file, the cache, a
process pool, and the fix loop. Returns a :class:`Report` (data only); the
CLI turns it into output and an exit code."""

from __future__ import annotations

import os
import sys
import traceback
from dataclasses import dataclass, field

from autoport_cst.atomic import write_atomic as _write_atomic
from autoport_cst.errors import InputError, Position
from autoport_cst.lint import cache as cache_mod
from autoport_cst.lint.config import (
    LintSettings,
    find_config,
    load_config,
    settings_for,
)
from autoport_cst.lint.diagnostics import ERROR, Diagnostic, FileResult

PRUNED_DIRS = frozenset({"__pycache__", "node_modules", "venv", "build", "dist", "site-packages"})
SUFFIXES = (".py", ".pyi")


@dataclass
class RunOptions:
    fix: bool = False
    diff: bool = False
    unsafe_fixes: bool = False
    select: list[str] | None = None
    ignore: list[str] | None = None
    use_cache: bool = True
    config: str | None = None
    force_exclude: bool = False
    jobs: int | None = None
    cache_dir: str | None = None
    # with use_cache False: keep results in this process only (cache.MemoryCache)
    memory_cache: bool = False


@dataclass
class Report:
    results: list[FileResult] = field(default_factory=list)
    cache_hits: int = 0

    @property
    def diagnostics(self) -> list[Diagnostic]:
        out = [d for r in self.results for d in r.diagnostics]
        out.sort(key=Diagnostic.sort_key)
        return out

    @property
    def errors(self) -> list[str]:
        return [f"{r.path}: {r.error}" for r in self.results if r.error]

    def count(self, severity: str = ERROR) -> int:
        return sum(1 for r in self.results for d in r.diagnostics if d.severity == severity)


# -- discovery ------------------------------------------------------------------


def display_path(path: str) -> str:
    absolute = os.path.abspath(path)
    cwd = os.getcwd()
    if absolute == cwd or absolute.startswith(cwd + os.sep):
        return os.path.relpath(absolute, cwd)
    return path


def discover(paths: list[str], options: RunOptions) -> list[tuple[str, LintSettings]]:
    """Files to lint, each with its settings (CLI selection applied)."""
    resolved: dict[int, LintSettings] = {}

    def settings(path: str) -> LintSettings:
        base = settings_for(path, options.config)
        key = id(base)
        if key not in resolved:
            resolved[key] = base.with_cli(options.select, options.ignore)
        return resolved[key]

    out: list[tuple[str, LintSettings]] = []
    seen: set[str] = set()
    for raw in paths:
        if not os.path.exists(raw):
            raise InputError("no such file or directory", Position(raw))
        if os.path.isdir(raw):
            for root, dirs, files in os.walk(raw):
                dirs[:] = sorted(
                    d
                    for d in dirs
                    if not d.startswith(".") and d not in PRUNED_DIRS and not d.endswith(".egg-info")
                )
                current = settings(os.path.join(root, "__init__.py"))
                if current.excluded(root) and os.path.abspath(root) != os.path.abspath(raw):
                    dirs[:] = []
                    continue
                for name in sorted(files):
                    if not name.endswith(SUFFIXES):
                        continue
                    path = os.path.join(root, name)
                    absolute = os.path.abspath(path)
                    if absolute in seen:
                        continue
                    file_settings = settings(path)
                    if file_settings.excluded(path):
                        continue
                    seen.add(absolute)
                    out.append((display_path(path), file_settings))
        else:
            absolute = os.path.abspath(raw)
            if absolute in seen:
                continue
            file_settings = settings(raw)
            if options.force_exclude and file_settings.excluded(raw):
                continue
            seen.add(absolute)
            out.append((display_path(raw), file_settings))
    return out


def cache_directory(options: RunOptions) -> str:
    if options.cache_dir:
        return options.cache_dir
    env = os.environ.get("AUTOPORT_CST_CACHE_DIR")
    if env:
        return env
    config = options.config or find_config(os.getcwd())
    if config is not None:
        settings = load_config(config)
        if settings.cache_dir:
            return settings.cache_dir
        return os.path.join(os.path.dirname(os.path.abspath(config)), cache_mod.DEFAULT_DIR)
    return os.path.join(os.getcwd(), cache_mod.DEFAULT_DIR)


def _result_cache(options: RunOptions) -> cache_mod.Cache | None:
    if options.use_cache:
        return cache_mod.Cache(cache_directory(options))
    return cache_mod.MemoryCache() if options.memory_cache else None


# -- one file ---------------------------------------------------------------------


def lint_one(path: str, data: bytes, settings: LintSettings, enabled: frozenset[str]) -> FileResult:
    """Lint one file's bytes; an exception inside a rule becomes ``error``."""
    from autoport_cst.lint.engine import lint_module, parse, source_text

    try:
        module, syntax = parse(data, path)
        if syntax is not None:
            return FileResult(path, [syntax])
        assert module is not None  # parse returns a module or a diagnostic
        diagnostics = lint_module(module, path, settings, enabled, source_text(data, module))
        return FileResult(path, diagnostics)
    except Exception as error:  # noqa: BLE001 - reported as an internal error (exit 2)
        where = traceback.extract_tb(error.__traceback__)[-1]
        return FileResult(
            path,
            [],
            error=(
                f"internal error: {type(error).__name__}: {error} "
                f"(at {os.path.basename(where.filename)}:{where.lineno})"
            ),
        )


_POOL_STATE: list = []


def _pool_task(index: int) -> FileResult:
    path, data, settings, enabled = _POOL_STATE[index]
    return lint_one(path, data, settings, enabled)


def _worker_ignores_ctrl_c() -> None:
    """A worker leaves Ctrl-C to the parent, which stops it."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _lint_many(
    items: list[tuple[str, bytes, LintSettings, frozenset[str]]], jobs: int | None
) -> list[FileResult]:
    """Lint ``items``, in ``jobs`` forked workers when it pays. Ctrl-C
    (KeyboardInterrupt in the parent, ignored by the workers) stops the
    workers at once, mid-file, instead of waiting for their chunks; a Ctrl-C
    while they are forked is deferred until they are, not lost."""
    cpus = os.cpu_count() or 1
    if jobs is None:
        jobs = min(cpus, max(1, (len(items) + 3) // 4))
    if jobs <= 1 or len(items) < 4 or sys.platform == "win32":
        return [lint_one(*item) for item in items]
    import multiprocessing

    import libcst

    from autoport_cst.interrupts import interrupts_deferred

    libcst.parse_module("pass\n")  # warm the parser before forking
    _POOL_STATE[:] = items  # inherited by the forked workers
    pool = None
    try:
        context = multiprocessing.get_context("fork")
        chunk = max(1, len(items) // (jobs * 8))
        with interrupts_deferred():
            pool = context.Pool(jobs, initializer=_worker_ignores_ctrl_c)
        return pool.map(_pool_task, range(len(items)), chunksize=chunk)
    finally:
        if pool is not None:
            with interrupts_deferred():  # a second Ctrl-C does not leave workers behind
                pool.terminate()
        _POOL_STATE.clear()


# -- the run ------------------------------------------------------------------------


def run(paths: list[str], options: RunOptions | None = None) -> Report:
    options = options or RunOptions()
    from autoport_cst.lint.config import clear_caches
    from autoport_cst.lint.rules import registry

    clear_caches()  # configuration is read once per run

    registry()  # import the rules once, before any fork
    files = discover(paths, options)
    report = Report()
    cache = _result_cache(options)
    fingerprints: dict[tuple[int, frozenset[str]], str] = {}

    results: dict[str, FileResult] = {}
    todo: list[tuple[str, bytes, LintSettings, frozenset[str]]] = []
    keys: dict[str, str] = {}
    for path, settings in files:
        try:
            with open(path, "rb") as handle:
                data = handle.read()
        except OSError as error:
            results[path] = FileResult(path, error=f"cannot read: {error.strerror or error}")
            continue
        enabled = settings.enabled(path)
        if cache is not None:
            fp_key = (id(settings), enabled)
            if fp_key not in fingerprints:
                fingerprints[fp_key] = settings.fingerprint(enabled)
            cache_key = cache_mod.key(data, fingerprints[fp_key])
            keys[path] = cache_key
            cached = cache.get(cache_key, path)
            if cached is not None:
                results[path] = FileResult(path, cached, cached=True)
                if not (options.fix or options.diff):
                    continue
                from autoport_cst.lint.fixes import wanted_fixes

                if not wanted_fixes(cached, options.unsafe_fixes):
                    continue
        if options.fix or options.diff:
            results[path] = _fix_one(path, data, settings, options)
            continue
        todo.append((path, data, settings, enabled))

    for result in _lint_many(todo, options.jobs):
        results[result.path] = result
        if cache is not None and result.error is None and result.path in keys:
            cache.put(keys[result.path], result.diagnostics)
    if cache is not None:
        report.cache_hits = cache.hits
        cache.save()
    report.results = [results[path] for path, _ in files if path in results]
    return report


def _fix_one(path: str, data: bytes, settings: LintSettings, options: RunOptions) -> FileResult:
    from autoport_cst.lint.fixes import fix_source

    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return lint_one(path, data, settings, settings.enabled(path))
    try:
        result = fix_source(text, path, settings, unsafe=options.unsafe_fixes)
    except Exception as error:  # noqa: BLE001
        return FileResult(path, error=f"internal error while fixing: {type(error).__name__}: {error}")
    if options.fix and not options.diff and result.changed and result.fixed is not None:
        write_atomic(path, result.fixed.encode("utf-8"))
    return result


def write_atomic(path: str, data: bytes) -> None:
    """Write a fixed file atomically (the project's one atomic writer)."""
    _write_atomic(path, data)
