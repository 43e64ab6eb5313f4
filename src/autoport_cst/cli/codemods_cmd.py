"""``autoport-cst codemods``: the codemod library, generated from the codemod files."""

from __future__ import annotations

import json

import click

from autoport_cst.cli.common import error_boundary, stdout_console


@click.group("codemods", invoke_without_command=True)
@click.option(
    "--output-format",
    type=click.Choice(["text", "json", "markdown"]),
    default="text",
    show_default=True,
    help="markdown: the table of README.md",
)
@click.pass_context
@error_boundary
def codemods_command(ctx, output_format):
    """List the codemod library: ID, the spec fields each realizes, its
    parameters and a one-line description. `codemods show ID` prints one
    codemod's documentation and examples."""
    if ctx.invoked_subcommand is not None:
        return
    from autoport_cst.transform.library import library

    codemods = library()
    if output_format == "markdown":
        from autoport_cst.transform.library_table import markdown_table

        click.echo(markdown_table(codemods), nl=False)
        return
    if output_format == "json":
        data = [
            {
                "id": cls.ID,
                "summary": cls.summary(),
                "realizes": list(cls.REALIZES),
                "params": [
                    {"name": n, "type": t, "default": d, "doc": doc} for n, t, d, doc in cls.param_docs()
                ],
                "after": list(cls.AFTER),
                "files": list(cls.FILES),
                "safe": cls.SAFE,
                "examples": len(cls.EXAMPLES),
            }
            for cls in codemods.values()
        ]
        click.echo(json.dumps(data, indent=2))
        return
    from rich.table import Table

    table = Table(title=f"{len(codemods)} codemods", title_justify="left")
    table.add_column("id", no_wrap=True)
    table.add_column("realizes")
    table.add_column("parameters")
    table.add_column("description")
    for cls in codemods.values():
        params = ", ".join(name for name, *_ in cls.param_docs()) or "-"
        table.add_row(cls.ID, "\n".join(cls.REALIZES) or "-", params, cls.summary())
    stdout_console().print(table)


@codemods_command.command("show")
@click.argument("codemod_id")
@error_boundary
def show_command(codemod_id):
    """Print the documentation, parameters and examples of CODEMOD_ID."""
    from rich.markup import escape
    from rich.syntax import Syntax

    from autoport_cst.transform.library import get_codemod

    cls = get_codemod(codemod_id)
    console = stdout_console()
    console.print(f"[bold]{cls.ID}[/]" + ("" if cls.SAFE else "  [yellow](changes numerics: unsafe fix)[/]"))
    console.print()
    console.print(escape(cls.documentation()))
    console.print()
    console.print(f"realizes: {escape(_realized(cls))}")
    console.print(f"files: {', '.join(cls.FILES)}")
    console.print(f"runs after: {', '.join(cls.AFTER) or '-'}")
    rows = cls.param_docs()
    if rows:
        console.print("parameters:")
        for name, type_name, default, doc in rows:
            console.print(f"  {name}: {escape(type_name)} = {escape(default)}  {escape(doc)}")
    for number, example in enumerate(cls.EXAMPLES, 1):
        console.print()
        title = f"example {number}: {example.title}" if example.title else f"example {number}"
        console.print(
            f"[bold]{escape(title)}[/]  ({example.path}, params {json.dumps(dict(example.params))})"
        )
        console.print("before:")
        console.print(Syntax(example.source, "python", theme="ansi_dark"))
        if example.raises:
            console.print(f"fails with a precondition error: {escape(example.raises)}")
        else:
            console.print("after:")
            console.print(Syntax(example.expected or "", "python", theme="ansi_dark"))


def _realized(cls) -> str:
    """The fields a codemod realizes, each with the changes it makes when it declares them."""
    from autoport_cst.transform.realizes import Realizes

    if not isinstance(cls.REALIZES, Realizes):
        return ", ".join(cls.REALIZES) or (f"({cls.PURPOSE})" if cls.PURPOSE else "-")
    return ", ".join(f"{path} ({changes})" for path, changes in cls.REALIZES.described().items())
