"""Which reference package a port's run-time checks read what they ask for.

Some checks a validation adds ask a port for what its reference declares
(the sequence-parallel prefill-length refusal, the forward without ``rank``,
decode context parallelism). They read it from the reference's code, not
from the port's: a port whose edit dropped the declaration must still be
asked.
"""

from __future__ import annotations

import json
from pathlib import Path


def reference_of(package_dir: str | Path) -> tuple[str, Path]:
    """(how to name it, its directory): the reference package the port's
    manifest (``reference.json``) names as its provenance, or the built-in
    reference of the manifest's name, else the port itself."""
    from autoport_cst.errors import InputError
    from autoport_cst.reference_models import builtin_references

    package_dir = Path(package_dir)
    try:
        manifest = json.loads((package_dir / "reference.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        manifest = {}
    named = (manifest.get("provenance") or {}).get("reference") if isinstance(manifest, dict) else None
    if isinstance(named, str):
        from autoport_cst.apply.reference import resolve_reference

        try:
            return f"reference {named}", resolve_reference(named)
        except InputError:
            pass
    name = manifest.get("name") if isinstance(manifest, dict) else None
    builtins = builtin_references()
    if isinstance(name, str) and name in builtins:
        return f"reference {name}", builtins[name]
    return "the port's own code", package_dir
