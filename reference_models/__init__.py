"""Reference model packages in the vllm_neuron style, one directory each.

These files are data for ``autoport-cst apply``: they are read by path and
transformed, never imported by the tool itself (they import ``vllm_neuron``).
Each directory holds the package files (``config.py``, ``factory.py``,
``__init__.py``, ``model.py``, ``README.md``), a ``reference.json`` manifest
with the reference's own architecture spec, and ``companions/`` with the files
a port also gets outside its package (an example and a logit test).
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent


def builtin_references() -> dict[str, Path]:
    """Name -> directory of every built-in reference."""
    return {
        path.name: path
        for path in sorted(ROOT.iterdir())
        if path.is_dir() and (path / "reference.json").is_file()
    }
