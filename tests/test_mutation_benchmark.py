"""benchmarks/mutation.py: its operators, its proofs of equivalence, its
sampling and the consistency of the figures it prints (end to end, slow)."""

from __future__ import annotations

import ast
import importlib.util
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

SOURCE = '''
import vllm_neuron.functional as NF


def forward(self, x, mask=None):
    """Docstring: not mutated."""
    if mask is not None and x.shape[0] > 1:
        raise ValueError(f"bad {x.shape[0] + 1}")
    assert x.dim() == 2
    logger.warning("scale %s", 2 * 3)
    y = NF.mlp(x, self.w, norm=True, skip=None)
    y = y.transpose(0, 1).softmax(dim=-1) * 0.5
    y += -x
    return y
'''


@pytest.fixture(scope="module")
def mutation():
    """benchmarks/mutation.py, which puts benchmarks/ on sys.path for its own
    modules (dataclasses need their module in sys.modules)."""
    spec = importlib.util.spec_from_file_location("mutation_benchmark", ROOT / "benchmarks" / "mutation.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


@pytest.fixture(scope="module")
def operators(mutation):
    return sys.modules["mutation_operators"]


def test_every_operator_finds_its_sites_and_each_mutant_parses(operators):
    parsed = operators.parse_mutants(SOURCE)
    keys = {m.key.split("@")[0] + " " + m.description for m in parsed.mutants}
    for expected in (
        "compare is not -> is",
        "compare > -> <=",
        "boolop and -> or",
        "nf-drop NF.mlp: skip dropped",
        "nf-option NF.mlp: norm=False",
        "nf-swap NF.mlp: #0 <-> #1",
        "dim transpose: dimensions swapped",
        "dim softmax: dim -1 -> -2",
        "dim transpose: #0 0 -> 1",
        "arith * -> /",
        "arith += -> -=",
        "unary - removed",
        "const 0.5 -> 1.0",
        "stmt removed: y = NF.mlp(x, self.w, norm=True, skip=None)",
    ):
        assert expected in keys, expected
    for mutant in parsed.mutants:
        ast.parse(parsed.mutated(mutant))
    assert len({m.key for m in parsed.mutants}) == len(parsed.mutants)


def test_error_paths_messages_and_logging_are_not_mutated(operators):
    parsed = operators.parse_mutants(SOURCE)
    lines = {m.line for m in parsed.mutants}
    assert not lines & {6, 8, 9, 10}  # docstring, raise, assert, logger.warning
    assert not any(m.operator == "bool" for m in parsed.mutants)  # the only literals are kernel options
    assert not any(m.description == "-1 -> -2" and m.operator == "const" for m in parsed.mutants)  # a dim


def test_equivalence_is_proved_by_normalising(operators):
    parsed = operators.parse_mutants(SOURCE)
    base = operators.normalised(SOURCE)
    by_description = {m.description: parsed.mutated(m) for m in parsed.mutants}
    assert operators.normalised(by_description["transpose: dimensions swapped"]) == base
    assert operators.normalised(by_description["* -> /"]) != base
    defaults = {"mlp": {"skip": None, "norm": False}}
    normal = operators.normalised(SOURCE, defaults)
    assert (
        operators.normalised(by_description["NF.mlp: skip dropped"], defaults) == normal
    )  # skip=None is the default
    assert (
        operators.normalised(by_description["NF.mlp: norm dropped"], defaults) != normal
    )  # norm=True is not
    hints = {"mlp": {"norm": operators.ANY}}
    assert operators.normalised(by_description["NF.mlp: norm dropped"], hints) == operators.normalised(
        SOURCE, hints
    )


def test_declared_defaults_come_from_the_kernels_signatures_and_options(mutation, operators):
    defaults = mutation.declared_defaults()
    assert defaults["attention_decode"]["rmsnorm_X_enabled"] is False
    assert defaults["attention_decode"]["K_cache_transposed"] is False  # a refused option's default
    assert "q" not in defaults["flash_attention"]  # a required argument has none


def test_the_held_out_partition_is_a_fixed_fifth(mutation, operators):
    parsed = operators.parse_mutants(SOURCE * 8)
    parts = [mutation.partition("p", m) for m in parsed.mutants]
    assert parts == [mutation.partition("p", m) for m in parsed.mutants]
    assert 0.1 < parts.count("held-out") / len(parts) < 0.3


def test_the_tally_line_adds_up(mutation, operators):
    mutant = operators.parse_mutants(SOURCE).mutants[0]
    outcomes = [
        mutation.Outcome("p", mutant, "tune", "run", verdict)
        for verdict in ("killed", "killed", "killed", "survived", "exit 2", "timeout", "equivalent")
    ]
    line = mutation.Tally(outcomes).line()
    assert line == (
        "7 mutants: killed 3, survived 1, exit 2 1, timeout 1, equivalent 1; "
        "kill rate 50.0% (3 of 6 non-equivalent)"
    )


TALLY = re.compile(
    r"^(\d+) mutants: killed (\d+), survived (\d+), exit 2 (\d+), timeout (\d+), equivalent (\d+); "
    r"kill rate (n/a|[\d.]+%) \((\d+) of (\d+) non-equivalent\)$",
    re.M,
)


def _check_tally(section: str, listed: bool = True) -> tuple[int, ...]:
    *counts, rate, killed_again, non_equivalent = TALLY.search(section).groups()
    total, killed, survived, exit2, timeout, equivalent = map(int, counts)
    assert total == killed + survived + exit2 + timeout + equivalent
    assert int(non_equivalent) == killed + survived + exit2 + timeout and int(killed_again) == killed
    if non_equivalent != "0":
        assert rate == f"{100 * killed / int(non_equivalent):.1f}%"
    listing = (("survived", survived), ("exit 2", exit2), ("timeout", timeout), ("equivalent", equivalent))
    for verdict, count in listing:
        assert not listed or len(re.findall(rf"^  {verdict}: ", section, re.M)) == count, verdict
    return total, killed, survived, exit2, timeout, equivalent


@pytest.mark.slow
def test_a_small_sample_over_five_ports_prints_consistent_figures(mutation, capsys, tmp_path):
    code = mutation.main(["--sample", "3", "--held-out", "1", "--steps", "4", "--workdir", str(tmp_path)])
    printed = capsys.readouterr().out
    assert code == 0
    population = printed.split("port      mutants", 1)[1].split("\n== ", 1)[0]
    ports = re.findall(r"^(\w+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)  ", population, re.M)
    assert len(ports) >= 4
    for _name, mutants, in_run, variant, outside, _held in ports:
        assert int(mutants) == int(in_run) + int(variant) + int(outside)
    tune = printed.split("== tune partition ==", 1)[1].split("== held-out partition ==", 1)[0]
    held = printed.split("== held-out partition ==", 1)[1].split("== all ==", 1)[0]
    both = [_check_tally(tune), _check_tally(held)]
    assert both[0][0] == 3 * len(ports) and both[1][0] == len(ports)
    total = _check_tally(printed.split("== all ==", 1)[1], listed=False)
    assert total == tuple(a + b for a, b in zip(*both, strict=True))
    assert re.search(r"^target >= 98% of non-equivalent mutants killed: (met|MISSED)$", printed, re.M)


def test_each_mutant_is_validated_as_validate_runs_by_default(mutation, monkeypatch, tmp_path):
    """The benchmark's verdict is validate's default: nothing it runs by
    default (the config variants, the TP=2 and DP 2 layouts) is turned off."""
    import inspect

    import autoport_cst.validate as validate_package

    calls = []

    def recording(package, checkpoint, **options):
        calls.append(options)
        raise RuntimeError("recorded")

    monkeypatch.setattr(validate_package, "validate_model", recording)
    port = sys.modules["mutation_setup"].Port("p", tmp_path, "A", tmp_path)
    assert mutation.validate(port, tmp_path, 4)[0] == "exit 2"
    defaults = {
        name: p.default
        for name, p in inspect.signature(
            sys.modules["autoport_cst.validate.api"].validate_model
        ).parameters.items()
        if p.default is not inspect.Parameter.empty
    }
    assert defaults["config_variants"] is True and defaults["parallel_layouts"] is True
    assert defaults["lint"] is True  # the hardware rules first (validate.lint_gate)
    assert calls == [{"steps": 4, "tp": 1, "dtype": "fp32"}]


def _port(tmp_path):
    return sys.modules["mutation_setup"].Port("p", tmp_path, "A", tmp_path)


def test_a_validation_past_its_cpu_budget_is_a_timeout(mutation, monkeypatch, tmp_path):
    """A validation that computes on without a verdict is its own verdict,
    ``timeout``, after the budget's CPU seconds (not wall: load stretches wall time)."""
    import autoport_cst.validate as validate_package

    def spinning(package, checkpoint, **options):
        started = time.process_time()
        while time.process_time() - started < 30:
            pass
        raise AssertionError("not stopped")

    monkeypatch.setattr(validate_package, "validate_model", spinning)
    started = time.perf_counter()
    verdict, detail = mutation.validate(_port(tmp_path), tmp_path, 4, mutation.Budget(cpu_s=0.5))
    assert verdict == "timeout" and detail.startswith("no verdict within 0 s of CPU"), detail
    assert time.perf_counter() - started < 25


def test_a_validation_that_waits_past_the_wall_backstop_is_a_timeout(mutation, monkeypatch, tmp_path):
    import autoport_cst.validate as validate_package

    monkeypatch.setattr(validate_package, "validate_model", lambda *a, **k: time.sleep(30))
    verdict, detail = mutation.validate(_port(tmp_path), tmp_path, 4, mutation.Budget(wall_s=1.5))
    assert verdict == "timeout" and detail.startswith("no verdict within 2 s wall"), detail
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)  # no timer left behind


def test_the_cpu_time_of_live_rank_processes_counts(mutation):
    """The ranks of a layout run are child processes: their CPU time counts
    while they run (from /proc), not only once they are waited for."""
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time\nt = time.process_time()\nwhile time.process_time() - t < 1.5: pass\ntime.sleep(60)",
        ]
    )
    try:
        before = mutation.tree_cpu_seconds()
        deadline = time.monotonic() + 60
        while mutation.tree_cpu_seconds() - before < 1.0 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert mutation.tree_cpu_seconds() - before >= 1.0
        assert child.poll() is None  # still running: not yet in RUSAGE_CHILDREN
    finally:
        child.kill()
        child.wait()


def test_a_mutants_budget_scales_with_the_unmutated_ports_cpu_time(mutation):
    assert mutation.Budget.scaled(40.0).cpu_s == mutation.CPU_FACTOR * 40.0
    assert mutation.Budget.scaled(1.0).cpu_s == mutation.CPU_FLOOR_S


def test_mutants_names_lines_of_the_ports(mutation):
    assert mutation.chosen_lines("qwen2:438, phi3:336,qwen2:1057") == {"qwen2": {438, 1057}, "phi3": {336}}
    for bad in ("qwen9:4", "qwen2", "qwen2:x"):
        with pytest.raises(SystemExit) as raised:
            mutation.parse_args(["--mutants", bad])
        assert raised.value.code == 2


LOADER = """
def load_weights(self, path, tied, extra):
    mappings = {}
    for layer in range(2):
        prefix = f"model.layers.{layer}"
        mappings[f"{prefix}.input_norm.weight"] = f"{prefix}.input_norm.weight"
        mappings[f"{prefix}.qkv_weight"] = [f"{prefix}.q.weight", f"{prefix}.k.weight"]
    mappings["model.norm.weight"] = "model.norm.weight"
    if tied:
        mappings["lm_head.weight"] = "model.embed_tokens.weight"
    else:
        mappings["lm_head.weight"] = "lm_head.weight"
    return checkpoint.load_sharded_pipelined(self.rank, 2, self, mappings, "cpu")
"""


BRANCHES = LOADER[LOADER.index("    if tied:") : LOADER.index("    return")]


def _line(source: str, text: str) -> int:
    return next(i for i, line in enumerate(source.splitlines(), 1) if text in line)


def test_a_loader_entry_mapping_a_parameter_to_its_own_name_is_proved_equivalent(mutation):
    """The readers take ``mappings.get(name, name)``: an entry ``D[k] = k``
    removed changes nothing, when no other entry can have its key on that run."""
    proofs = sys.modules["mutation_proofs"]
    readers = mutation.mapping_readers()
    assert "load_sharded_pipelined" in readers
    for text in ('[f"{prefix}.input_norm.weight"]', '["model.norm.weight"]', '= "lm_head.weight"'):
        assert proofs.identity_mapping(LOADER, _line(LOADER, text), readers), text
    assert not proofs.identity_mapping(LOADER, _line(LOADER, '= "model.embed'), readers)  # not its own
    assert not proofs.identity_mapping(LOADER, _line(LOADER, '["model.norm.weight"]'), {"other"})
    for changed in (
        LOADER.replace("    return checkpoint", "    print(mappings)\n    return checkpoint"),  # read
        LOADER.replace(BRANCHES, "    for _ in range(2):\n" + textwrap.indent(BRANCHES, "    ")),  # a loop
        LOADER.replace("    if tied:", "    mappings[extra] = 'x'\n    if tied:"),  # a key that may be any
        LOADER.replace(
            "    if tied:", '    mappings["lm_head.weight"] = "x"\n    if tied:'
        ),  # an earlier entry
    ):
        line = _line(changed, '= "lm_head.weight"')
        assert not proofs.identity_mapping(changed, line, readers), changed


def test_a_trailing_positional_argument_that_passes_the_declared_default_is_dropped(mutation, operators):
    """``NF.o_proj(x, w, None)`` is ``NF.o_proj(x, w)``: its third parameter,
    ``bias``, defaults to None (the stand-in's signature)."""
    defaults = mutation.declared_defaults()
    assert defaults["o_proj"][operators.POSITIONAL][:3] == ("active", "weight", "bias")
    forms = {
        call: operators.normalised(f"y = NF.o_proj({call})\n", defaults)
        for call in ("x, w, None", "x, w", "x, w, b", "x, None", "x, w, bias=None")
    }
    assert forms["x, w, None"] == forms["x, w"] == forms["x, w, bias=None"]
    assert forms["x, w, b"] != forms["x, w"] and forms["x, None"] != forms["x, w"]


def test_an_enum_member_that_is_the_declared_default_is_dropped(mutation, operators):
    """``scaling_mode=Mode.POST_SCALE`` passes ``moe_cte``'s declared default when
    ``Mode`` is the stand-in's enum, imported from the module the port names;
    another member, another enum, a rebound name or a name of unknown origin is kept."""
    defaults = mutation.declared_defaults()
    mode = defaults["moe_cte"]["expert_affinities_scaling_mode"]
    assert mode.name == "POST_SCALE"
    header = "from nkilib.core.utils.common_types import ExpertAffinityScaleMode as Mode, ActFnType\n"

    def form(text: str) -> str:
        return operators.normalised(text, defaults)

    def call(argument: str) -> str:
        return f"y = NF.moe_cte(hidden_states=x{argument})\n"

    assert form(header + call(", expert_affinities_scaling_mode=Mode.POST_SCALE")) == form(header + call(""))
    post = ", expert_affinities_scaling_mode=Mode.POST_SCALE"
    for prefix, argument in (
        (header, ", expert_affinities_scaling_mode=Mode.NO_SCALE"),  # another member
        (header, ", expert_affinities_scaling_mode=ActFnType.SiLU"),  # another enum
        (header + "Mode = object()\n", post),  # the name rebound
        ("from elsewhere import Mode\n", post),  # a module that is not the stand-in's
        ("", post),  # a name of unknown origin
    ):
        assert form(prefix + call(argument)) != form(prefix + call("")), (prefix, argument)


WIRED = """from torch import nn
from vllm_neuron.distributed import get_neuron_mlp_dp_group


class MLP(nn.Module):
    def __init__(self, size):
        super().__init__()
        self.mlp_dp_group = get_neuron_mlp_dp_group()
        self.size = size
        self.mlp_share_index = size // 2 if self.size > 1 else 0

    def forward(self, x, is_prefill):
        tokens = x.shape[0]
        if is_prefill and (tokens <= self.size or tokens % self.size != 0):
            raise ValueError("length")
        if self.size > 1:
            x = x + self.mlp_share_index
        return x * self.size
"""


def test_the_benchmark_applies_the_group_proof_and_no_refusal_proof(mutation, operators, tmp_path):
    """PortRun.proof reaches mutation_proof_attributes (with the stand-in's
    parallel-state getters) and mutation_proof_alternatives; a refusal narrowed or widened is not proved
    equivalent (the narrowed one runs inputs the port refuses: on the
    device, a collective over a length the TP size does not divide)."""
    assert {"get_neuron_mlp_dp_group", "get_tp_group"} <= mutation.group_getters()
    (tmp_path / "model.py").write_text(WIRED, encoding="utf-8")
    (tmp_path / "config.json").write_text('{"model_type": "llama"}', encoding="utf-8")
    run = mutation.PortRun.of(_port(tmp_path), {})
    by_key = {m.key: m for m in run.parsed.mutants}
    removed = next(m for k, m in by_key.items() if k.startswith("stmt@8:"))
    narrowed = next(m for k, m in by_key.items() if k.startswith("boolop@") and "or -> and" in k)
    widened = next(m for k, m in by_key.items() if k.startswith("boolop@") and "and -> or" in k)
    assert "no instance of MLP reads mlp_dp_group" in run.proof(removed, run.parsed.mutated(removed))
    assert run.proof(narrowed, run.parsed.mutated(narrowed)) is None
    assert run.equivalence(run.parsed.mutated(widened)) is None
    alternative = next(k for k in by_key if k.startswith("const@10:") and k.endswith(":0 -> 1"))
    proof = run.proof(by_key[alternative], run.parsed.mutated(by_key[alternative]))
    assert "every read of it runs under `if self.size > 1`" in proof
