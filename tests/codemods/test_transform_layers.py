"""transform/ in three layers: the CST vocabulary (``cst``), the model-anatomy
locators (``anatomy``) and the edit primitives (``edit``), each importing only
the layers below it, and no import cycle among the modules of ``transform``
(imports inside functions included, type-only ones not)."""

from __future__ import annotations

import ast
from pathlib import Path

import autoport_cst.transform as transform

ROOT = Path(transform.__file__).parent
PACKAGE = "autoport_cst.transform"
# what each layer may import from transform (``base``: the framework, with
# the package's own lazy exports)
ALLOWED = {
    "cst": {"cst"},
    "anatomy": {"cst", "anatomy", "base"},
    "edit": {"cst", "anatomy", "edit", "base"},
}


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join((PACKAGE, *parts))


def _nodes(tree: ast.AST):
    """Every node of ``tree`` but those of ``if TYPE_CHECKING:`` blocks (type-only)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        yield node
        yield from _nodes(node)


def _imports(path: Path) -> set[str]:
    """The transform modules ``path`` imports at run time, anywhere in the file."""
    found = set()
    for node in _nodes(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(PACKAGE):
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                found.add(
                    full if (ROOT / Path(*full.split(".")[2:])).with_suffix(".py").exists() else node.module
                )
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith(PACKAGE))
    return found


def _layer(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 2 or parts[2] in ("base", "realizes"):
        return "base"
    return parts[2]


def _graph() -> dict[str, set[str]]:
    return {_module(p): _imports(p) for p in ROOT.rglob("*.py")}


def test_the_layers_are_packages():
    for layer in ALLOWED:
        assert (ROOT / layer / "__init__.py").exists(), layer


def test_each_layer_imports_only_the_layers_below_it():
    wrong = []
    for module, imports in _graph().items():
        layer = _layer(module)
        if layer not in ALLOWED:
            continue
        wrong += [f"{module} -> {i}" for i in sorted(imports) if _layer(i) not in ALLOWED[layer]]
    assert wrong == []


def test_no_import_cycle_in_transform():
    graph = _graph()
    cycles = []
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for other in sorted(graph.get(node, ())):
            if other not in graph or other == node or other == PACKAGE:
                continue
            if state.get(other) == 1:
                cycles.append(" -> ".join(stack[stack.index(other) :] + [other]))
            elif other not in state:
                visit(other, [*stack, other])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert cycles == []


def test_lint_reads_the_cst_layer_and_the_anatomy_only():
    lint = ROOT.parent / "lint"
    wrong = []
    for path in lint.rglob("*.py"):
        for imported in _imports(path):
            if _layer(imported) not in ("cst", "anatomy") and path.name != "fixes.py":
                wrong.append(f"{path.relative_to(lint)} -> {imported}")
    assert wrong == []
