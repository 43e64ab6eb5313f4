"""Mutation score of the validator: how many wrong ports does it catch?

    python benchmarks/mutation.py [--sample 30] [--held-out 10] [--seed 0] [--full] [--only qwen2,...]
    python benchmarks/mutation.py --mutants qwen2:438,phi3:336

Five verified ports: ``qwen2``, ``phi3`` and ``gemma2`` (applied from their
example plans on llama3), ``mixtral`` (on qwen3_moe) and the ``qwen3``
reference package itself. Each port's ``model.py`` is mutated with the
operators of ``mutation_operators.py`` (one change per mutant: an arithmetic
or comparison operator, a constant, an argument of an ``NF`` kernel call, a
boolean kernel option, a ``dim``, a statement of a function body), and each
mutant is validated in this process as ``autoport-cst validate`` does by
default (``validate_model`` at TP=1 in fp32 on the port's default tiny
checkpoint, which goes on, when it passes, to the config variants the port's
``reference.json`` declares and to the parallel layouts of
``validate.parallel_checks``: TP=2, attention data parallelism 2, data
parallelism 2 of the MLP, embedding and LM head, and of the embedding alone,
two tokens per decode step, prompt embeddings at TP=1 and TP=2, the
four-rank layouts, for a port whose reference takes decode context
parallelism its DCP layouts (``validate.dcp_layouts``), and for a
mixture-of-experts checkpoint EP 2 at TP=2, their ranks as local processes).

Scope. The lines each port executes in the default validation of the
unmutated port, traced in this process (``mutation_setup.py``), are measured
first: its TP=1 run on the default tiny checkpoint and on one tiny checkpoint
per config variant its ``reference.json`` declares (``config_driven``: RoPE
type, tied embeddings, ...). Mutants on lines no such run reaches are counted
as ``outside`` and not sampled: error paths, the FP8 KV cache, context and
expert parallelism, and code only the rank processes of the parallel layouts
execute (their lines are not traced; the population, and so the sample, is
the one a TP=1 run defines). Mutants reached only on a declared variant are
sampled and validated like the others (on the default checkpoint, as
``validate`` runs).

Sampling. Every mutant has a stable key (operator, line, column, change). A
fixed fifth of them (``HOLD_OUT``, by a hash of the key) is held out: never
looked at while the operators and the classification were tuned, and
reported separately. From each partition ``--sample`` / ``--held-out``
mutants per port are drawn with ``random.Random`` seeded by ``--seed`` and
the port's name; ``--full`` validates every mutant in scope.

Classes:

- ``killed``: the validation fails (exit 1): a hardware rule the port breaks
  (``validate.lint_gate``, before it runs), a component or logit gate, or the
  port fails to import, build, load or run;
- ``survived``: the mutant validates (exit 0);
- ``exit 2``: the validator refused the run as bad input (``InputError``) or
  failed itself: a wrong port reported as if the input were wrong; counted
  with the survivors in the kill rate;
- ``timeout``: no verdict within the mutant's budget, counted with the
  survivors in the kill rate (a validation that does not end catches nothing).
  The budget is CPU time, so that load on the machine does not turn slow
  verdicts into timeouts: ``CPU_FACTOR`` times the CPU time the unmutated
  port's own default validation took in the same run (measured after its
  preparation), at least ``CPU_FLOOR_S``, counted over the validating process
  tree (this process, its finished rank processes, and its live descendants
  read from ``/proc``: ``tree_cpu_seconds``); and ``WALL_BACKSTOP_S`` of wall
  time for a run that waits without computing;
- ``equivalent``: proved equivalent, the mutant's AST equals the original's
  once normalised (``mutation_operators.normalised``: formatting dropped, the
  two dimensions of ``transpose`` in a fixed order; a kernel argument that
  passes its declared default dropped, an enum member argument compared as
  the member its stand-in import names), or a removed loader entry mapping a
  parameter to the checkpoint key of its own name, which the checkpoint
  readers' ``mappings.get(name, name)`` supplies (``mutation_proofs``), or a
  literal default that no run takes: a module-level function's default that
  every call passes, or ``R.get(key, default)`` on the RoPE parameters read
  only for RoPE types whose parameters transformers' own validation requires
  to hold ``key`` (``mutation_proof_defaults``), or a removed ``a = <constant>``
  in the ``then`` branch of an ``if`` after which every read of ``a`` sits
  under a later test that branch's conjuncts rule out (``mutation_proof_paths``),
  or a removed ``self.A = <parallel-state getter>()`` of an ``__init__`` whose
  class and the classes related to it by inheritance never read ``A``
  (``mutation_proof_attributes``), or the ``else`` constant of an
  ``__init__``'s ``self.A = X if C else K`` where every read of ``A`` sits under
  an ``if`` with ``C`` as a conjunct, ``C`` of attributes stored once before it
  (``mutation_proof_alternatives``). Only these are left out of the kill rate
  (a refusal narrowed, ``or`` to ``and`` in an ``if ...: raise``, is not: the
  mutant runs inputs the port refuses).

Printed per partition: killed, survived, exit 2, timeout and equivalent
counts, the kill rate over the non-equivalent mutants, and each survivor,
exit 2 and timeout with its line before and after. ``--mutants port:line,...``
validates every mutant of those lines (whatever its partition and scope)
instead of a sample, with the same classification and budget. ``--explain`` runs each survivor again on what the default
run does not drive, until one run catches it: the declared variants whose
lines it changes, then bf16, an FP8 KV cache, data parallelism of each
component alone, TP=2 with expert parallelism (``LADDER``; a setting counts
only where the unmutated port
validates with it), and prints the first that catches it.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import hashlib
import inspect
import itertools
import os
import random
import resource
import signal
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))

from mutation_operators import ANY, IMPORTABLE, POSITIONAL, Mutant, ParsedModule, normalised, parse_mutants  # noqa: E402
from mutation_proof_alternatives import unread_alternative  # noqa: E402
from mutation_proof_attributes import unread_group  # noqa: E402
from mutation_proof_defaults import required_key, transformers_requires, unused_default  # noqa: E402
from mutation_proof_paths import dead_store  # noqa: E402
from mutation_proofs import identity_mapping  # noqa: E402
from mutation_setup import PORTS, Port, prepare  # noqa: E402

HOLD_OUT = 5  # one mutant in HOLD_OUT is held out
HOLD_OUT_SALT = "autoport-cst mutation hold-out v1"
TARGET = 0.98
# A mutant's budget: CPU seconds of the validating process tree, scaled from the
# unmutated port's default validation in the same run; a wall-clock backstop
CPU_FACTOR = 5
CPU_FLOOR_S = 60.0
WALL_BACKSTOP_S = 3600.0
CHECK_EVERY_S = 1.0
VERDICTS = ("killed", "survived", "exit 2", "timeout", "equivalent")
PARTITIONS = ("tune", "held-out")
# What ``--explain`` runs a survivor on after the declared variants: the
# validator's settings its default run leaves out (TP=2, attention DP 2, MLP,
# embedding and LM-head DP 2 together, embedding DP 2 alone are part of it:
# validate.parallel_checks)
LADDER = (
    ("bf16", {"dtype": "bf16"}),
    ("FP8 KV cache", {"kv_cache_dtype": "fp8"}),
    ("attention DP 2", {"attention_dp": 2}),
    ("MLP DP 2", {"mlp_dp": 2}),
    ("LM-head DP 2", {"lm_head_dp": 2}),
    ("EP 2 at TP=2", {"tp": 2, "ep": 2}),
)


def partition(port: str, mutant: Mutant) -> str:
    digest = hashlib.sha256(f"{HOLD_OUT_SALT}|{port}|{mutant.key}".encode()).digest()
    return "held-out" if int.from_bytes(digest[:8], "big") % HOLD_OUT == 0 else "tune"


def scope(port: Port, mutant: Mutant) -> str:
    """``run`` when the default validation executes one of the mutant's
    lines, else the first declared variant that does, else ``outside``."""
    lines = set(range(mutant.line, mutant.end_line + 1))
    for label, covered in port.coverage.items():
        if lines & covered:
            return label
    return "outside"


@dataclass
class Outcome:
    """One validated mutant."""

    port: str
    mutant: Mutant
    partition: str
    scope: str
    verdict: str  # killed, survived, exit 2, timeout, equivalent
    detail: str = ""
    before: str = ""
    after: str = ""
    seconds: float = 0.0
    caught_by: list[str] | None = None  # what catches a survivor (``--explain``)


class _Timeout(Exception):
    pass


def tree_cpu_seconds() -> float:
    """CPU time (user and system) of this process, of its children it has
    waited for (the rank processes of finished runs, with theirs), and of its
    live descendants (from ``/proc``, where there is one)."""
    own, reaped = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    total = own.ru_utime + own.ru_stime + reaped.ru_utime + reaped.ru_stime
    return total + _live_descendants_cpu()


def _live_descendants_cpu() -> float:
    """utime + stime + cutime + cstime of every live descendant of this process."""
    parents: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # gone meanwhile
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # from field 3 (state) on
        parents[int(entry.name)] = int(fields[1])
        ticks[int(entry.name)] = sum(int(f) for f in fields[11:15])
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    found, todo = 0, list(children.get(os.getpid(), []))
    while todo:
        pid = todo.pop()
        found += ticks[pid]
        todo += children.get(pid, [])
    return found / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Budget:
    """How much a validation may take before it is a ``timeout``: CPU seconds
    of the validating process tree (``tree_cpu_seconds``), and wall seconds."""

    cpu_s: float = float("inf")
    wall_s: float = WALL_BACKSTOP_S

    @classmethod
    def scaled(cls, baseline_cpu_s: float) -> Budget:
        """``CPU_FACTOR`` times the unmutated port's validation, at least ``CPU_FLOOR_S``."""
        return cls(cpu_s=max(CPU_FLOOR_S, CPU_FACTOR * baseline_cpu_s))


@contextlib.contextmanager
def _watched(budget: Budget):
    """Raise ``_Timeout`` in this (main) thread once the code inside has used
    up ``budget``, checked every ``CHECK_EVERY_S`` of wall time (a one-shot
    timer re-armed after each check, so that checks never nest)."""
    cpu0, wall0 = tree_cpu_seconds(), time.monotonic()

    def check(_signum, _frame):
        cpu, wall = tree_cpu_seconds() - cpu0, time.monotonic() - wall0
        if cpu > budget.cpu_s:
            raise _Timeout(f"no verdict within {budget.cpu_s:.0f} s of CPU ({wall:.0f} s wall)")
        if wall > budget.wall_s:
            raise _Timeout(f"no verdict within {budget.wall_s:.0f} s wall ({cpu:.0f} s of CPU)")
        signal.setitimer(signal.ITIMER_REAL, CHECK_EVERY_S)

    previous = signal.signal(signal.SIGALRM, check)
    signal.setitimer(signal.ITIMER_REAL, CHECK_EVERY_S)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def validate(
    port: Port, checkpoint: Path, steps: int, budget: Budget | None = None, **settings: object
) -> tuple[str, str]:
    """(verdict, detail) of validating the port's package as it is on disk,
    as ``validate`` does by default (TP=1 in fp32, then the declared config
    variants and the parallel layouts) unless ``settings`` (``validate_model``'s
    options) say otherwise; ``timeout`` past ``budget`` (default: the wall
    backstop alone)."""
    from autoport_cst.errors import InputError
    from autoport_cst.validate import validate_model

    options: dict = {"tp": 1, "dtype": "fp32", **settings}
    try:
        with _watched(budget or Budget()):
            report = validate_model(port.package, checkpoint, steps=steps, **options)
    except _Timeout as error:
        return "timeout", str(error)
    except InputError as error:
        return "exit 2", f"bad input: {_first_line(error)}"
    except Exception as error:  # noqa: BLE001 - the validator's own failure is a finding
        return "exit 2", f"validator error: {type(error).__name__}: {_first_line(error)}"
    if report.equivalent:
        return "survived", ""
    if report.failure is not None:
        return "killed", f"fails at {report.failure.stage}: {_first_line(report.failure.message)[:100]}"
    return "killed", f"diverges: {report.first_diverging or ', '.join(report.failed_checks)[:100]}"


def _first_line(error: object) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def changed_lines(original: str, mutated: str) -> tuple[str, str]:
    """The first line the mutant removes and the first it adds."""
    removed, added = "", ""
    for line in difflib.unified_diff(original.splitlines(), mutated.splitlines(), n=0, lineterm=""):
        if line.startswith("-") and not line.startswith("---") and not removed:
            removed = line[1:].strip()
        elif line.startswith("+") and not line.startswith("+++") and not added:
            added = line[1:].strip()
    return removed, added


def declared_defaults() -> dict[str, dict[str, object]]:
    """Per ``NF`` kernel, the value each keyword parameter takes when it is
    left out, as the API declares it (the stand-in's signatures, written from
    the kernels' documentation, and its per-kernel ``KernelOptions``: refused
    options with their defaults, performance hints as ``ANY``)."""
    from autoport_cst.validate import standin
    from autoport_cst.validate.standin import functional
    from autoport_cst.validate.standin.kernel_options import KernelOptions

    defaults: dict[str, dict[str, object]] = {}
    for name, kernel in vars(functional).items():
        if inspect.isfunction(kernel) and not name.startswith("_"):
            parameters = inspect.signature(kernel).parameters.values()
            defaults[name] = {
                p.name: p.default for p in parameters if p.default is not inspect.Parameter.empty
            }
            defaults[name][POSITIONAL] = tuple(
                p.name for p in itertools.takewhile(lambda p: p.kind is p.POSITIONAL_OR_KEYWORD, parameters)
            )
    for module in [m for n, m in sys.modules.items() if n.startswith("autoport_cst.validate.standin.")]:
        for options in vars(module).values():
            if isinstance(options, KernelOptions):
                declared = defaults.setdefault(options.op, {})
                declared.update(options.refused)
                declared.update(dict.fromkeys(options.hints, ANY))
    # what a port's `from M import N` binds (the stand-in's module tables), to read enum members
    defaults[IMPORTABLE] = {
        module: entry
        for name, table in vars(standin).items()
        if name.endswith("_MODULES")
        for module, entry in table.items()
    }
    return defaults


def mapping_readers() -> frozenset[str]:
    """The checkpoint readers of the API that take a parameter's keys as
    ``mappings.get(name, name)``: the stand-in's ``vllm_neuron.utils.checkpoints``
    methods with a ``mappings`` parameter (its module docstring declares the
    default, from vllm_neuron's documentation)."""
    from autoport_cst.validate.standin import checkpoints

    assert "mappings.get(name, name)" in (checkpoints.__doc__ or "")
    return frozenset(
        name
        for owner in vars(checkpoints).values()
        if inspect.isclass(owner) and owner.__module__ == checkpoints.__name__
        for name, method in vars(owner).items()
        if inspect.isfunction(method) and "mappings" in inspect.signature(method).parameters
    )


def group_getters() -> frozenset[str]:
    """The API's parallel-state getters: the stand-in's ``parallel_state``
    functions of no parameter that return a ``GroupCoordinator``."""
    from autoport_cst.validate.standin import parallel_state

    coordinator = parallel_state.GroupCoordinator
    return frozenset(
        name
        for name, function in vars(parallel_state).items()
        if inspect.isfunction(function)
        and function.__module__ == parallel_state.__name__
        and not inspect.signature(function).parameters
        and inspect.signature(function).return_annotation in ("GroupCoordinator", coordinator)
    )


@dataclass
class PortRun:
    """A prepared port, its parsed model file and its mutant population."""

    port: Port
    parsed: ParsedModule
    original: str
    scopes: dict[str, str]  # mutant key -> scope
    partitions: dict[str, str]  # mutant key -> partition
    defaults: dict[str, dict[str, object]]  # declared_defaults()
    controls: dict[str, bool] = field(default_factory=dict)  # explain's settings the port validates with
    budget: Budget = field(default_factory=Budget)  # a mutant's (``measure_budget``)

    @classmethod
    def of(cls, port: Port, defaults: dict[str, dict[str, object]]) -> PortRun:
        original = port.model_file.read_text(encoding="utf-8")
        parsed = parse_mutants(original)
        scopes = {m.key: scope(port, m) for m in parsed.mutants}
        partitions = {m.key: partition(port.name, m) for m in parsed.mutants}
        return cls(port, parsed, original, scopes, partitions, defaults)

    def equivalence(self, code: str) -> str | None:
        """Why ``code`` is proved equivalent to the port, or None."""
        if not hasattr(self, "_forms"):
            self._forms = (normalised(self.original), normalised(self.original, self.defaults))
        if normalised(code) == self._forms[0]:
            return "identical to the port once normalised"
        if normalised(code, self.defaults) == self._forms[1]:
            return "drops a kernel argument that passes the kernel's declared default (or a hint)"
        return None

    def proof(self, mutant: Mutant, code: str) -> str | None:
        """Why the mutant is proved equivalent (``equivalence``, a removed
        loader entry mapping a parameter to its own name: ``mutation_proofs``, or
        a removed store no path reads: ``mutation_proof_paths``, a removed
        group attribute no instance reads: ``mutation_proof_attributes``, a
        conditional attribute's ``else`` constant no read takes:
        ``mutation_proof_alternatives``), or None. A refusal narrowed (``or`` to ``and`` in an ``if ...: raise``) is
        not proved: the mutant runs inputs the port refuses."""
        found = self.equivalence(code)
        if found is None and mutant.operator == "stmt":
            found = (
                identity_mapping(self.original, mutant.line, mapping_readers())
                or dead_store(self.original, mutant.line, self.elsewhere())
                or unread_group(self.original, mutant.line, self.elsewhere(), group_getters())
            )
        if found is None:
            found = unused_default(self.original, mutant, self.elsewhere()) or required_key(
                self.original, mutant, self.rope_requires(), self.elsewhere()
            )
        return found or unread_alternative(self.original, code, mutant.line, self.elsewhere())

    def elsewhere(self) -> list[str]:
        """The texts that could name one of the port's functions or attributes
        besides its ``model.py``: the package's other Python files and the stand-in's."""
        if not hasattr(self, "_elsewhere"):
            from autoport_cst.validate import standin

            files = [p for p in self.port.package.glob("*.py") if p != self.port.model_file]
            files += sorted(Path(standin.__file__).parent.rglob("*.py"))
            self._elsewhere = [p.read_text(encoding="utf-8") for p in files]
        return self._elsewhere

    def rope_requires(self):
        """Whether transformers' validation requires a key of RoPE parameters of a
        type, for the config class of the port's checkpoint."""
        if not hasattr(self, "_requires"):
            import json

            from transformers import CONFIG_MAPPING

            config = json.loads((self.port.checkpoint / "config.json").read_text(encoding="utf-8"))
            self._requires = transformers_requires(CONFIG_MAPPING[config["model_type"]])
        return self._requires

    def in_scope(self, part: str) -> list[Mutant]:
        return [
            m
            for m in self.parsed.mutants
            if self.partitions[m.key] == part and self.scopes[m.key] != "outside"
        ]

    def sample(self, part: str, count: int | None, seed: int) -> list[Mutant]:
        population = self.in_scope(part)
        if count is None or count >= len(population):
            return population
        chosen = random.Random(f"{seed}|{self.port.name}|{part}").sample(population, count)
        return sorted(chosen, key=lambda m: (m.line, m.column, m.key))

    def measure_budget(self, steps: int) -> str:
        """Validate the unmutated port as a mutant is validated, and scale a
        mutant's budget from the CPU time it took; returns what was measured."""
        cpu, wall = tree_cpu_seconds(), time.perf_counter()
        verdict, detail = validate(self.port, self.port.checkpoint, steps)
        cpu, wall = tree_cpu_seconds() - cpu, time.perf_counter() - wall
        if verdict != "survived":
            raise RuntimeError(f"{self.port.name}: the unmutated port does not validate: {verdict} {detail}")
        self.budget = Budget.scaled(cpu)
        return (
            f"{self.port.name}: the unmutated port validates in {cpu:.1f} s of CPU ({wall:.1f} s wall); "
            f"a mutant's budget: {self.budget.cpu_s:.0f} s of CPU"
        )

    def run(self, mutant: Mutant, steps: int) -> Outcome:
        code = self.parsed.mutated(mutant)
        outcome = Outcome(
            self.port.name,
            mutant,
            self.partitions[mutant.key],
            self.scopes[mutant.key],
            "equivalent",
        )
        outcome.before, outcome.after = changed_lines(self.original, code)
        proof = self.proof(mutant, code)
        if proof is not None:
            outcome.detail = proof
            return outcome
        started = time.perf_counter()
        self.port.model_file.write_text(code, encoding="utf-8")
        try:
            outcome.verdict, outcome.detail = validate(self.port, self.port.checkpoint, steps, self.budget)
        finally:
            self.port.model_file.write_text(self.original, encoding="utf-8")
        outcome.seconds = time.perf_counter() - started
        return outcome

    def explain(self, outcome: Outcome, steps: int) -> None:
        """Run a survivor again where the default run does not look, until
        one run catches it: the declared variants that execute its lines,
        then the validator's other settings (``LADDER``) on which the
        unmutated port validates."""
        lines = set(range(outcome.mutant.line, outcome.mutant.end_line + 1))
        ladder = [
            (v.label, v.checkpoint, {})
            for v in self.port.variants
            if lines & self.port.coverage.get(v.label, set())
        ]
        ladder += [(label, self.port.checkpoint, settings) for label, settings in LADDER]
        outcome.caught_by = []
        for label, checkpoint, settings in ladder:
            if not self.control(label, checkpoint, settings, steps):
                continue
            self.port.model_file.write_text(self.parsed.mutated(outcome.mutant), encoding="utf-8")
            try:
                verdict, _ = validate(self.port, checkpoint, steps, self.budget, **settings)
            finally:
                self.port.model_file.write_text(self.original, encoding="utf-8")
            if verdict == "killed":
                outcome.caught_by.append(label)
                return

    def control(self, label: str, checkpoint: Path, settings: dict, steps: int) -> bool:
        """Whether the unmutated port validates with these settings (once)."""
        if label not in self.controls:
            verdict = validate(self.port, checkpoint, steps, self.budget, **settings)[0]
            self.controls[label] = verdict == "survived"
        return self.controls[label]


@dataclass
class Tally:
    """The counts of one set of outcomes."""

    outcomes: list[Outcome]

    def count(self, verdict: str) -> int:
        return sum(o.verdict == verdict for o in self.outcomes)

    @property
    def non_equivalent(self) -> int:
        return len(self.outcomes) - self.count("equivalent")

    @property
    def rate(self) -> float | None:
        """Killed over the non-equivalent mutants (survived, exit 2 and timeout count against it)."""
        return self.count("killed") / self.non_equivalent if self.non_equivalent else None

    def line(self) -> str:
        rate = "n/a" if self.rate is None else f"{100 * self.rate:.1f}%"
        counts = ", ".join(f"{verdict} {self.count(verdict)}" for verdict in VERDICTS[:-1])
        return (
            f"{len(self.outcomes)} mutants: {counts}, equivalent {self.count('equivalent')}; "
            f"kill rate {rate} ({self.count('killed')} of {self.non_equivalent} non-equivalent)"
        )


def print_population(runs: list[PortRun]) -> None:
    print(f"{'port':<8} {'mutants':>8} {'in run':>7} {'variant':>8} {'outside':>8} {'held out':>9}  variants")
    for run in runs:
        scopes = Counter(run.scopes.values())
        variant_only = sum(n for s, n in scopes.items() if s not in ("run", "outside"))
        held = sum(p == "held-out" for p in run.partitions.values())
        labels = ", ".join(v.label for v in run.port.variants if v.label in run.port.coverage) or "-"
        print(
            f"{run.port.name:<8} {len(run.parsed.mutants):>8} {scopes['run']:>7} {variant_only:>8} "
            f"{scopes['outside']:>8} {held:>9}  {labels}"
        )
        for label, why in run.port.refused_variants.items():
            print(f"         variant {label} not run: {why[:110]}")


def print_partition(name: str, outcomes: list[Outcome]) -> Tally:
    tally = Tally(outcomes)
    print(f"\n== {name} ==")
    print(tally.line())
    by_operator = Counter((o.mutant.operator, o.verdict) for o in outcomes)
    for operator in sorted({o.mutant.operator for o in outcomes}):
        counts = ", ".join(
            f"{v} {by_operator[(operator, v)]}" for v in VERDICTS if by_operator[(operator, v)]
        )
        print(f"  {operator:<10} {counts}")
    for verdict in ("equivalent", "exit 2", "timeout", "survived"):
        listed = [o for o in outcomes if o.verdict == verdict]
        if listed:
            print(f"{verdict} ({len(listed)}):")
        for o in listed:
            print(
                f"  {verdict}: {o.port} model.py:{o.mutant.line} [{o.mutant.operator}] {o.mutant.description}"
            )
            print(f"      scope: {o.scope}" + (f"; {o.detail}" if o.detail else ""))
            print(f"      - {o.before}\n      + {o.after}")
            if o.caught_by is not None:
                print(
                    f"      caught by: {', '.join(o.caught_by) or 'none of the variants or settings tried'}"
                )
    return tally


def chosen_lines(text: str) -> dict[str, set[int]]:
    """``--mutants``: port -> the lines of its ``model.py`` whose mutants to validate."""
    chosen: dict[str, set[int]] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, line = item.partition(":")
        if name not in {s.name for s in PORTS} or not line.isdigit():
            raise ValueError(
                f"--mutants: {item!r} is not PORT:LINE with PORT one of {', '.join(s.name for s in PORTS)}"
            )
        chosen.setdefault(name, set()).add(int(line))
    return chosen


def drawn(run: PortRun, part: str, count: int, args: argparse.Namespace) -> list[Mutant]:
    """The mutants of one port and partition to validate: ``--mutants``' lines, or the sample."""
    if args.mutants:
        lines = chosen_lines(args.mutants).get(run.port.name, set())
        return [m for m in run.parsed.mutants if m.line in lines and run.partitions[m.key] == part]
    return run.sample(part, None if args.full else count, args.seed)


def run_benchmark(args: argparse.Namespace, workdir: Path) -> dict[str, Tally]:
    names = set(args.only.split(",")) if args.only else None
    if args.mutants:
        names = set(chosen_lines(args.mutants))
    sources = [s for s in PORTS if names is None or s.name in names]
    runs = []
    for source in sources:
        started = time.perf_counter()
        port = prepare(source, workdir, args.steps)
        runs.append(PortRun.of(port, declared_defaults()))
        print(f"prepared {source.name} in {time.perf_counter() - started:.1f} s", flush=True)
        print(runs[-1].measure_budget(args.steps), flush=True)
    print()
    print_population(runs)
    outcomes: dict[str, list[Outcome]] = {p: [] for p in PARTITIONS}
    for part, count in (("tune", args.sample), ("held-out", args.held_out)):
        for run in runs:
            for mutant in drawn(run, part, count, args):
                outcome = run.run(mutant, args.steps)
                detail = f" ({outcome.detail})" if outcome.detail else ""
                print(
                    f"{part} {run.port.name} {mutant.key}: {outcome.verdict}{detail}",
                    file=sys.stderr,
                    flush=True,
                )
                if outcome.verdict == "survived" and args.explain:
                    run.explain(outcome, args.steps)
                outcomes[part].append(outcome)
    tallies = {part: print_partition(f"{part} partition", outcomes[part]) for part in PARTITIONS}
    tallies["all"] = Tally(outcomes["tune"] + outcomes["held-out"])
    print(f"\n== all ==\n{tallies['all'].line()}")
    return tallies


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sample", type=int, default=30, help="tune-partition mutants per port")
    parser.add_argument("--held-out", type=int, default=10, help="held-out mutants per port")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sampling")
    parser.add_argument("--full", action="store_true", help="every mutant in scope (hours)")
    parser.add_argument("--only", default="", help="comma-separated port names")
    parser.add_argument(
        "--mutants",
        default="",
        metavar="PORT:LINE,...",
        help="validate every mutant of these lines of the ports' model.py instead of a sample",
    )
    parser.add_argument("--steps", type=int, default=16, help="decode steps of each validation")
    parser.add_argument("--explain", action="store_true", help="run survivors on variants and bf16")
    parser.add_argument("--workdir", type=Path, default=None, help="keep the ports and checkpoints here")
    args = parser.parse_args(argv)
    try:
        chosen_lines(args.mutants)
    except ValueError as error:
        parser.error(str(error))  # exit 2
    return args


def _cpu_seconds() -> float:
    """CPU time of this process and of its finished children (the ranks)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sys.dont_write_bytecode = True  # a mutant must never be read from a stale .pyc
    started, cpu = time.perf_counter(), _cpu_seconds()
    one, _, _ = os.getloadavg()
    print(
        f"mutation benchmark: validate's default (TP=1 fp32, config variants, TP=2 and DP 2), "
        f"{args.steps} decode steps, seed {args.seed}, "
        f"1 in {HOLD_OUT} mutants held out; "
        + (
            f"every mutant of {args.mutants}"
            if args.mutants
            else f"sample {'all' if args.full else args.sample} + {'all' if args.full else args.held_out} per port"
        )
        + f"; a mutant's budget {CPU_FACTOR}x the unmutated port's CPU time, at least {CPU_FLOOR_S:.0f} s; "
        f"load average {one:.1f} on {os.cpu_count()} cores"
    )
    if args.workdir is not None:
        tallies = run_benchmark(args, args.workdir)
    else:
        with tempfile.TemporaryDirectory(prefix="autoport-mutation-") as tmp:
            tallies = run_benchmark(args, Path(tmp))
    rate = tallies["all"].rate
    verdict = "n/a" if rate is None else ("met" if rate >= TARGET else "MISSED")
    print(f"target >= {100 * TARGET:.0f}% of non-equivalent mutants killed: {verdict}")
    print(
        f"{time.perf_counter() - started:.0f} s wall, {_cpu_seconds() - cpu:.0f} s CPU "
        "(this process and its rank processes)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
