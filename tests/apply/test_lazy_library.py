"""A port imports the codemods it runs, not the library: ``get_codemod`` imports
one module, and the composer finds the codemods that realize a field of the
diff by reading the modules' text (``realizing``), with the same answers as
asking every codemod."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from autoport_cst.spec import leaf_fields
from autoport_cst.transform.library import codemod_ids, library, realizing

PROBE = """
import json, sys
from autoport_cst.apply import build_port, load_reference
from autoport_cst.plan import load_plan
plan = load_plan(sys.argv[1])
result = build_port(plan, load_reference(plan.reference))
assert result.ok, result.failure
imported = sorted(n.rsplit(".", 1)[1] for n in sys.modules if n.startswith("autoport_cst.codemods."))
print(json.dumps({"imported": imported, "steps": [s.codemod for s in result.steps],
                  "diff": [d.path for d in result.composition.diffs]}))
"""


def test_the_ids_are_the_librarys_without_importing_it():
    assert codemod_ids() == list(library())


def test_the_codemods_realizing_a_field_are_those_that_declare_it():
    for path, _, _ in leaf_fields():
        assert realizing(path) == [cls for cls in library().values() if path in cls.REALIZES], path


def test_a_port_imports_its_steps_and_the_codemods_of_its_diff_only(repo_root):
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(repo_root / "examples" / "qwen2.plan.json")],
        capture_output=True,
        text=True,
        check=True,
    )
    found = json.loads(out.stdout)
    allowed = {s.replace("-", "_") for s in found["steps"]}
    for module in (repo_root / "codemods").glob("*.py"):  # the modules that spell a field of the diff
        text = module.read_text(encoding="utf-8")
        if any(f'"{path}"' in text or f"'{path}'" in text for path in found["diff"]):
            allowed.add(module.stem)
    assert {s.replace("-", "_") for s in found["steps"]} <= set(found["imported"])
    assert set(found["imported"]) <= allowed
    assert len(found["imported"]) < len(codemod_ids()) / 2
    # config-guards names attention.qkv_bias only inside a longer string: not imported for it
    assert "config_guards" not in found["imported"]


def test_a_codemod_module_spells_its_realizes_paths_as_string_literals():
    for codemod_id, cls in library().items():
        text = (Path(sys.modules[cls.__module__].__file__ or "")).read_text(encoding="utf-8")
        for path in cls.REALIZES:
            assert f'"{path}"' in text or f"'{path}'" in text, (codemod_id, path)
