"""The lint cache's engine signature changes with what a rule's result
depends on besides the file: the lint package, the transform package its
rules read code with (NRN006's derivations, NRN008's aliases live in
``transform.anatomy``), and the installed transformers, whose source NRN008
reads. Before, only the lint package counted: an edited alias reader or a
new transformers reused stale results."""

from __future__ import annotations

import os
from pathlib import Path

from autoport_cst.lint.config import signature


def _package(root: Path) -> Path:
    for name in ("lint/rules/a_rule.py", "transform/anatomy/config.py"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("x = 1\n")
    return root


def test_the_signature_follows_the_transform_package_and_transformers(tmp_path):
    package = _package(tmp_path)
    before = signature(package, "5.25.0")
    assert signature(package, "5.25.0") == before
    assert signature(package, "5.19.0") != before

    anatomy = package / "transform" / "anatomy" / "config.py"
    anatomy.write_text("x = 22\n")
    assert signature(package, "5.25.0") != before

    anatomy.write_text("x = 1\n")
    os.utime(anatomy, ns=(1, 1))
    changed_time = signature(package, "5.25.0")
    assert changed_time != before  # same size, another modification time
    (package / "lint" / "rules" / "a_rule.py").write_text("x = 333\n")
    assert signature(package, "5.25.0") != changed_time
