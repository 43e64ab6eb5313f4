"""The plan schema that the examples name in ``$schema`` ships with the
repository and is what ``autoport-cst schema plan`` prints."""

from __future__ import annotations

import json

from click.testing import CliRunner

from autoport_cst.cli import cli

REGENERATE = "autoport-cst schema plan > schemas/plan.schema.json"


def test_the_shipped_plan_schema_is_up_to_date(repo_root):
    shipped = repo_root / "schemas" / "plan.schema.json"
    printed = CliRunner().invoke(cli, ["schema", "plan"])
    assert printed.exit_code == 0, printed.output
    assert shipped.is_file(), f"{shipped} is missing: {REGENERATE}"
    assert shipped.read_text() == printed.output, f"{shipped} is out of date: {REGENERATE}"


def test_every_schema_key_of_the_examples_names_an_existing_file(repo_root):
    plans = sorted((repo_root / "examples").glob("*.plan.json"))
    assert plans
    for path in plans:
        target = json.loads(path.read_text()).get("$schema")
        if target is None:
            continue
        assert "://" not in target, f"{path.name}: $schema {target!r} is not a file of this repository"
        assert (path.parent / target).resolve().is_file(), f"{path.name}: $schema {target!r} does not exist"
