"""Fields of a model package's config dataclass (``<Prefix>Config``).

Codemods that make a port read a new setting from the checkpoint's config add
a dataclass field for it. New fields go in one block before ``torch_dtype``,
opened by a marker comment and sorted by name, so that codemods adding fields
give the same file whatever order they run in."""

from __future__ import annotations

import libcst as cst

from autoport_cst.transform.base import FileContext
from autoport_cst.transform.cst_helpers import (
    classes_with_role,
    parse_statement,
    with_comment,
)
from autoport_cst.transform.vocabulary import is_docstring, leading_lines, statements


def config_class(module: cst.Module, ctx: FileContext, codemod_id: str) -> cst.ClassDef:
    configs = classes_with_role(module, "config")
    if len(configs) != 1:
        raise ctx.precondition(
            f"{codemod_id}: expected one config dataclass (<Prefix>Config) in the config file, "
            f"found {len(configs)}"
        )
    return configs[0]


def _field_name(stmt: cst.CSTNode) -> str | None:
    if (
        isinstance(stmt, cst.SimpleStatementLine)
        and len(stmt.body) == 1
        and isinstance(stmt.body[0], cst.AnnAssign)
        and isinstance(stmt.body[0].target, cst.Name)
    ):
        return stmt.body[0].target.value
    return None


def config_fields(cls: cst.ClassDef) -> dict[str, cst.SimpleStatementLine]:
    """name -> statement of each ``name: annotation [= default]`` field."""
    return {
        name: s
        for s in statements(cls)
        if isinstance(s, cst.SimpleStatementLine) and (name := _field_name(s)) is not None
    }


FIELDS_MARKER = "<-- MODEL-SPECIFIC: fields of this architecture's features (sorted by name)"


def add_config_fields(
    module: cst.Module,
    ctx: FileContext,
    codemod_id: str,
    fields: list[tuple[str, str]],
) -> cst.Module:
    """Add dataclass fields (``(code, comment)``, code like ``name: int | None
    = None``) that the config class does not have yet.

    They go in one block right before ``torch_dtype`` (or after the last
    field), opened by a marker comment and sorted by name, so that codemods
    adding fields give the same file in any order."""
    cls = config_class(module, ctx, codemod_id)
    body = list(statements(cls))
    present = set(config_fields(cls))
    changed = False
    for code, comment in fields:
        stmt = parse_statement(code, module)
        name = _field_name(stmt)
        assert name is not None, code
        if name in present:
            continue
        stmt = with_comment(stmt, comment) if comment else stmt.with_changes(leading_lines=[])
        names = [_field_name(s) for s in body]
        if "torch_dtype" in names:
            end = names.index("torch_dtype")
        else:
            last = [i for i, n in enumerate(names) if n is not None]
            if not last:
                raise ctx.precondition(f"{codemod_id}: {cls.name.value} has no fields", cls, module)
            end = last[-1] + 1
        start = next((i for i in range(end) if _has_marker(body[i])), None)
        if start is None:
            body.insert(end, _with_marker(stmt))
        else:
            position = start
            while position < end and (held := names[position]) is not None and held < name:
                position += 1
            if position == start:
                body[start] = _without_marker(body[start])
                stmt = _with_marker(stmt)
            body.insert(position, stmt)
        present.add(name)
        changed = True
    if not changed:
        return module
    new_cls = cls.with_changes(body=cls.body.with_changes(body=body))
    return module.with_changes(body=[new_cls if s is cls else s for s in module.body])


def _has_marker(stmt: cst.BaseStatement) -> bool:
    return any(
        line.comment is not None and FIELDS_MARKER in line.comment.value for line in leading_lines(stmt)
    )


def _with_marker(stmt: cst.BaseStatement) -> cst.BaseStatement:
    marker = cst.EmptyLine(comment=cst.Comment(f"# {FIELDS_MARKER}"))
    return stmt.with_changes(leading_lines=[marker, *leading_lines(stmt)])


def _without_marker(stmt: cst.BaseStatement) -> cst.BaseStatement:
    return stmt.with_changes(
        leading_lines=[
            line
            for line in leading_lines(stmt)
            if line.comment is None or FIELDS_MARKER not in line.comment.value
        ]
    )


def prepend_to_post_init(
    body: list[cst.BaseStatement], statements: list[cst.BaseStatement], module: cst.Module
) -> list[cst.BaseStatement]:
    """A config class body whose ``__post_init__`` runs ``statements`` first
    (after its docstring); the method is added at the end when absent."""
    if not statements:
        return body
    post_init = next(
        (s for s in body if isinstance(s, cst.FunctionDef) and s.name.value == "__post_init__"), None
    )
    if post_init is None:
        method = parse_statement("def __post_init__(self):\n    pass", module)
        assert isinstance(method, cst.FunctionDef)
        method = method.with_changes(
            body=method.body.with_changes(body=statements),
            leading_lines=[cst.EmptyLine(indent=False)],
        )
        return [*body, method]
    current = list(post_init.body.body)
    first = 1 if current and is_docstring(current[0]) else 0
    new_method = post_init.with_changes(
        body=post_init.body.with_changes(body=[*current[:first], *statements, *current[first:]])
    )
    return [new_method if s is post_init else s for s in body]
