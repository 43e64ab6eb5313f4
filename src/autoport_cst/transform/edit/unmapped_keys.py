"""Mapping entries for the parameters a reference's ``load_weights`` loads
under their own names, when checkpoint-keys' renames change those names."""

from __future__ import annotations

import libcst as cst

from autoport_cst.transform.anatomy.mappings import mapping_entries, parameter_names
from autoport_cst.transform.base import FileContext
from autoport_cst.transform.cst.snippets import parse_statement
from autoport_cst.transform.edit.key_renames import FIELD, KeyRenamer, expand, key_literal
from autoport_cst.transform.edit.tree import add_edit, with_comment


def unmapped_edits(
    codemod: str,
    fn: cst.FunctionDef,
    owner: cst.ClassDef,
    anchor: cst.CSTNode | None,
    variables: dict[str, str],
    renamer: KeyRenamer,
    module: cst.Module,
    ctx: FileContext,
    edits: dict,
) -> set[str]:
    """Entries for the parameters ``load_weights`` (``fn`` of ``owner``) does
    not map (they load under their own names) whose names the renames change,
    added after ``mappings = {}`` (``anchor``) into ``edits``; returns the
    patterns they match. A renamed parameter of every layer without an entry
    is a precondition error."""
    mapped = {FIELD.sub("{i}", expand(e.key, variables)) for e in mapping_entries(fn)}
    added: list[tuple[str, str]] = []
    per_layer: list[tuple[str, str]] = []
    matched: set[str] = set()
    for name in parameter_names(module, owner):
        new = renamer.apply(name)
        if name in mapped or new == name:
            continue
        matched |= renamer.matched(name)
        (per_layer if "{i}" in name else added).append((name, new))
    if per_layer:
        names = ", ".join(name for name, _ in per_layer)
        raise ctx.precondition(
            f"{codemod}: load_weights maps no entry for {names} (loaded under its own name), which the "
            "renames change; add the entry to the reference's per-layer mappings",
            fn,
            module,
        )
    if added and anchor is not None:
        statements = [
            parse_statement(f"mappings[{key_literal(name)}] = {key_literal(new)}", module)
            for name, new in added
        ]
        statements[0] = with_comment(statements[0], "parameters the reference loads under their own names")
        add_edit(edits, id(anchor), lambda updated, new=statements: cst.FlattenSentinel([updated, *new]))
    return matched
