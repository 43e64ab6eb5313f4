"""``autoport-cst schema``: the published JSON Schemas."""

from __future__ import annotations

import json

import click

from autoport_cst.cli.common import error_boundary

SCHEMAS = ("plan", "reference", "spec", "report")


@click.command("schema")
@click.argument("name", type=click.Choice(SCHEMAS))
@error_boundary
def schema_command(name):
    """Print the JSON Schema of NAME: `plan` (plan.json), `reference` (a
    reference package's reference.json), `spec` (the architecture spec) or
    `report` (the JSON report of `validate`)."""
    if name == "report":
        from autoport_cst.validate import report_schema_json

        click.echo(report_schema_json())
        return
    if name == "plan":
        from autoport_cst.plan import plan_schema

        schema = plan_schema()
    elif name == "reference":
        from autoport_cst.apply.reference import manifest_schema

        schema = manifest_schema()
    else:
        from autoport_cst.spec import ArchSpec, schema_of

        definitions: dict = {}
        root = schema_of(ArchSpec, definitions)
        schema = {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "title": "autoport-cst architecture spec",
            **root,
            "$defs": definitions,
        }
    click.echo(json.dumps(schema, indent=2))
