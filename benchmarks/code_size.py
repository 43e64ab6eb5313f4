"""Functions and files too long to read at once.

Lists every function (or method) longer than ``--max-function`` lines and
every file longer than ``--max-file`` lines among the Python files git
tracks, outside ``reference_models/`` (the reference packages keep the shape
of the real vllm_neuron ones) and ``tests/``. A function's length runs from
its ``def`` line to its last line (decorators apart); a nested function
counts in its own right and inside the function that holds it.

Run: python benchmarks/code_size.py [--max-function 80] [--max-file 800]
Exit code 0 when nothing is over, 1 otherwise.
"""

from __future__ import annotations

import argparse
import ast
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXCLUDED = ("reference_models/", "tests/")
MAX_FUNCTION = 80
MAX_FILE = 800


@dataclass(frozen=True)
class Long:
    """One function or file over its limit."""

    path: str
    line: int  # 1 for a file
    name: str  # the function's qualified name; "" for a file
    lines: int

    def __str__(self) -> str:
        where = f"{self.path}:{self.line}"
        return f"{self.lines:5d}  {where}  {self.name}" if self.name else f"{self.lines:5d}  {where}"


def source_files(root: Path = ROOT) -> list[str]:
    """The tracked Python files the limits apply to (repository-relative)."""
    listed = subprocess.run(
        ["git", "ls-files", "*.py"], cwd=root, capture_output=True, text=True, check=True
    ).stdout.split()
    return sorted(p for p in listed if not p.startswith(EXCLUDED) and (root / p).is_file())


def function_lengths(path: str, text: str) -> list[Long]:
    """Every function of one file with its length."""
    found: list[Long] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}"
                end = child.end_lineno or child.lineno
                found.append(Long(path, child.lineno, name, end - child.lineno + 1))
                visit(child, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(text, path), "")
    return found


def over_limits(
    root: Path = ROOT, max_function: int = MAX_FUNCTION, max_file: int = MAX_FILE
) -> tuple[list[Long], list[Long]]:
    """(functions over ``max_function`` lines, files over ``max_file``),
    longest first."""
    functions: list[Long] = []
    files: list[Long] = []
    for path in source_files(root):
        text = (root / path).read_text(encoding="utf-8")
        count = len(text.splitlines())
        if count > max_file:
            files.append(Long(path, 1, "", count))
        functions += [f for f in function_lengths(path, text) if f.lines > max_function]
    return sorted(functions, key=lambda f: -f.lines), sorted(files, key=lambda f: -f.lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-function", type=int, default=MAX_FUNCTION)
    parser.add_argument("--max-file", type=int, default=MAX_FILE)
    args = parser.parse_args(argv)
    functions, files = over_limits(ROOT, args.max_function, args.max_file)
    print(f"functions over {args.max_function} lines: {len(functions)}")
    for item in functions:
        print(f"  {item}")
    print(f"files over {args.max_file} lines: {len(files)}")
    for item in files:
        print(f"  {item}")
    return 1 if functions or files else 0


if __name__ == "__main__":
    sys.exit(main())
