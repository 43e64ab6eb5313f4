"""The research code split by spec section stays split: the code analysis
(``research/analysis``) and the spec decision (``research/decide``) import
from their orchestrator down to the sections and from the sections to the
shared state, never sideways or back up; the interpreter they run on
(``research/interp``) is built in layers, each module importing only the ones
below it; no module or function grows back into what it replaced (files up to
800 lines, functions up to 80)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

RESEARCH = Path(__file__).resolve().parents[2] / "src" / "autoport_cst" / "research"
PACKAGE = "autoport_cst.research"

# package -> (its orchestrator, shared modules every section may import)
LAYERS = {
    "analysis": ("code_analysis", {"state", "graph", "norms", "layer_inputs", "config_expressions"}),
    "decide": ("crosscheck", {"state"}),
}
# the one section a section builds on: the MoE experts are classified as MLPs
# declared edges between sections: MLA and attention written out are read as forms of attention, and an
# output gate is taken out of the attention's projections; the unsupported-feature decisions ask the
# attention decisions whether a config flag sets one KV head
SECTION_EDGES = {
    # ... and which of several expert modules is routed (the others stacked shared experts) by its own module
    # ... and what the router does to the chosen experts' weights (renormalised, scaled) by its own
    ("analysis", "moe"): {"mlp", "moe_experts", "routing_weights"},
    # ... and a position-dependent query scaling (attention temperature) is read off the traced attention
    # ... its norms (q/k, output and value norms) are read by a module of their own
    # ... and the config field its scale comes from, as for attention written out with ALiBi
    ("analysis", "attention"): {
        "latent",
        "scores",
        "output_gate",
        "temperature",
        "attention_norms",
        "scale_source",
        "window_source",
        "qkv_rows",  # a fused projection's layout read from the rows each head reads (2e27534)
        "query_gate",  # an output gate fused with the queries, per head (MiniCPM5-MoE's q_gate_proj)
    },
    # ... whose rows are read by running the split on them, as a fused QKV projection's are
    ("analysis", "query_gate"): {"qkv_rows"},
    ("analysis", "alibi"): {"scale_source"},
    # a mask the attention computes itself (a buffer of triangles) is read as a band of diagonals by a module
    # of its own; the config fields its window comes from, by another
    ("analysis", "scores"): {"band_mask"},
    ("analysis", "window_source"): {"band_mask"},
    # attention written out in a mixer: what its scores compute, read as the attention section reads them
    ("analysis", "mixers"): {"scores"},
    # an MLP width the code computes from other config fields: those fields, named by a module of their own
    ("analysis", "mlp"): {"width_source"},
    # the rule that picks the layers without RoPE; a rope_type's frequencies measured by a module of their own
    ("analysis", "rope"): {"nope_rule", "rope_variants"},
    ("analysis", "head"): {"multiplier_keys"},  # multipliers computed from several config fields
    # attention written out in the layer is recognized as the mixers section recognizes it in a mixer
    # ... and a bias per head on the scores is read as ALiBi by a module of its own, a table of sines and
    # cosines of the positions by another
    ("analysis", "block_features"): {"mixers", "alibi", "sinusoidal"},
    # a decoder whose layers are not attention blocks is named by what its blocks compute
    ("analysis", "decoder"): {"mixers"},
    ("decide", "unsupported"): {"attention"},
}
MAX_FILE_LINES = 800
MAX_FUNCTION_LINES = 80
# the interpreter's modules from the bottom up: each imports only modules before it
INTERP_LAYERS = (
    "values",
    "config_proxy",
    "walk",
    "operators",
    "externals",
    "core",
    "python_builtins",
    "classes",
    "expressions",
    "statements",
    "calls",
    "interpreter",
)


def _modules(package: str) -> dict[str, Path]:
    return {path.stem: path for path in sorted((RESEARCH / package).glob("*.py")) if path.stem != "__init__"}


def _imports(path: Path, package: str) -> set[str]:
    """The modules of ``package`` that ``path`` imports."""
    prefix = f"{PACKAGE}.{package}"
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == prefix:
                names |= {alias.name for alias in node.names}
            elif node.module.startswith(prefix + "."):
                names.add(node.module[len(prefix) + 1 :].split(".")[0])
        elif isinstance(node, ast.Import):
            names |= {
                a.name[len(prefix) + 1 :].split(".")[0] for a in node.names if a.name.startswith(prefix + ".")
            }
    return names


@pytest.mark.parametrize("package", sorted(LAYERS))
def test_sections_import_only_the_shared_state(package):
    orchestrator, shared = LAYERS[package]
    modules = _modules(package)
    assert shared <= set(modules)
    for name, path in modules.items():
        allowed = shared | SECTION_EDGES.get((package, name), set())
        if name in shared:
            allowed = shared - {name}
        found = _imports(path, package) - {name}
        assert found <= allowed, f"{package}/{name}.py imports {sorted(found - allowed)}"
    assert not _imports(RESEARCH / package / "__init__.py", package), (
        f"{package}/__init__.py imports its modules"
    )
    sections = set(modules) - shared
    used = _imports(RESEARCH / f"{orchestrator}.py", package)
    # a section run by another through a declared edge is run too (and what that one runs, in turn)
    for _ in SECTION_EDGES:
        used |= {
            t for (p, n), targets in SECTION_EDGES.items() if p == package and n in used for t in targets
        }
    assert sections <= used, f"{orchestrator}.py does not run {sorted(sections - used)}"


def test_shared_modules_form_no_cycle():
    for package, (_, shared) in LAYERS.items():
        modules = _modules(package)
        graph = {name: _imports(modules[name], package) & shared for name in shared}
        done: set[str] = set()

        def visit(
            name: str,
            stack: tuple[str, ...],
            package: str = package,
            graph: dict[str, set[str]] = graph,
            done: set[str] = done,
        ) -> None:
            assert name not in stack, f"import cycle in {package}: {' -> '.join(stack + (name,))}"
            if name in done:
                return
            for dep in graph[name]:
                visit(dep, stack + (name,))
            done.add(name)

        for name in graph:
            visit(name, ())


def test_interpreter_modules_import_only_the_layers_below():
    modules = _modules("interp")
    assert set(modules) == set(INTERP_LAYERS)
    assert not (RESEARCH / "interp.py").exists()
    for index, name in enumerate(INTERP_LAYERS):
        found = _imports(modules[name], "interp") - {name}
        below = set(INTERP_LAYERS[:index])
        assert found <= below, f"interp/{name}.py imports {sorted(found - below)}, not below it"
    assert not _imports(RESEARCH / "interp" / "__init__.py", "interp"), (
        "interp/__init__.py imports its modules"
    )


@pytest.mark.parametrize("package", [*sorted(LAYERS), "interp"])
def test_files_and_functions_stay_short(package):
    paths = list(_modules(package).values())
    if package in LAYERS:
        paths.append(RESEARCH / f"{LAYERS[package][0]}.py")
    assert paths, f"research/{package} holds no modules"
    for path in paths:
        text = path.read_text(encoding="utf-8")
        assert len(text.splitlines()) <= MAX_FILE_LINES, f"{path.name}: {len(text.splitlines())} lines"
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                assert length <= MAX_FUNCTION_LINES, f"{path.name}:{node.lineno} {node.name}: {length} lines"
