"""The package's import graph: no cycle (imports inside functions included,
type-only ones not) and no edge from the library up to the command line
(``autoport_cst.cli``), outside the codemod library and the reference
packages."""

from __future__ import annotations

import ast
from pathlib import Path

import autoport_cst

ROOT = Path(autoport_cst.__file__).parent
SKIPPED = ("codemods", "reference_models")


def _modules() -> dict[str, Path]:
    found = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[0] in SKIPPED:
            continue
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(("autoport_cst", *parts))] = path
    return found


def _nodes(tree: ast.AST):
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        yield node
        yield from _nodes(node)


def _imports(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules ``module`` imports at run time."""
    found = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in _nodes(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        for name in names:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name != module:
                found.add(name)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {m: _imports(m, p, modules) for m, p in modules.items()}


def test_no_import_cycle():
    graph = _graph()
    cycles = []
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for other in sorted(graph[node]):
            if other == "autoport_cst":  # the package itself: imported by every module
                continue
            if state.get(other) == 1:
                cycles.append(" -> ".join([*stack[stack.index(other) :], other]))
            elif other not in state:
                visit(other, [*stack, other])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert cycles == []


def test_the_library_does_not_import_the_command_line():
    edges = [
        f"{module} -> {imported}"
        for module, imports in _graph().items()
        if not module.startswith("autoport_cst.cli") and module != "autoport_cst.__main__"
        for imported in sorted(imports)
        if imported.startswith("autoport_cst.cli")
    ]
    assert edges == []
