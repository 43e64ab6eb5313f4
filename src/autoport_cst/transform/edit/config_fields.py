"""Fields of a model package's config dataclass (``<Prefix>Config``).

Codemods that make a port read a new setting from the checkpoint's config add
a dataclass field for it. New fields go in one block before ``torch_dtype``,
opened by a marker comment and sorted by name, so that codemods adding fields
give the same file whatever order they run in."""

from __future__ import annotations

import libcst as cst

from autoport_cst.transform import FileContext
from autoport_cst.transform.anatomy.classes import require_method, self_assignments
from autoport_cst.transform.anatomy.config import config_class, config_fields, field_name
from autoport_cst.transform.cst.snippets import parse_statement
from autoport_cst.transform.cst.vocabulary import (
    is_docstring,
    leading_lines,
    statements,
)
from autoport_cst.transform.edit.tree import append_statements_edit, with_comment

FIELDS_MARKER = "<-- MODEL-SPECIFIC: fields of this architecture's features (sorted by name)"


def add_config_fields(
    module: cst.Module,
    ctx: FileContext,
    fields: list[tuple[str, str]],
) -> cst.Module:
    """Add dataclass fields (``(code, comment)``, code like ``name: int | None
    = None``) that the config class does not have yet.

    They go in one block right before ``torch_dtype`` (or after the last
    field), opened by a marker comment and sorted by name, so that codemods
    adding fields give the same file in any order."""
    cls = config_class(module, ctx)
    body = list(statements(cls))
    present = set(config_fields(cls))
    changed = False
    for code, comment in fields:
        stmt = parse_statement(code, module)
        name = field_name(stmt)
        assert name is not None, code
        if name in present:
            continue
        stmt = with_comment(stmt, comment) if comment else stmt.with_changes(leading_lines=[])
        names = [field_name(s) for s in body]
        if "torch_dtype" in names:
            end = names.index("torch_dtype")
        else:
            last = [i for i, n in enumerate(names) if n is not None]
            if not last:
                raise ctx.refuse(f"{cls.name.value} has no fields", cls, module)
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


def config_scalar_edit(
    module: cst.Module,
    ctx: FileContext,
    key: str,
    annotation: str,
    default: object,
    comment: str,
) -> cst.Module:
    """The config-file half of a codemod that reads a scalar setting from the
    config: the dataclass field ``key: annotation = default``."""
    comment = comment.removeprefix("<-- MODEL-SPECIFIC: ")
    return add_config_fields(module, ctx, [(f"{key}: {annotation} = {default!r}", comment)])


def init_reads_config(module: cst.Module, ctx: FileContext, cls: cst.ClassDef, key: str) -> dict:
    """Edits that append ``self.<key> = config.<key>`` to ``cls.__init__``
    (none when it is already assigned). ``__init__`` must take ``config``."""
    init = require_method(module, ctx, cls, "__init__")
    if key in self_assignments(init):
        return {}
    names = [p.name.value for p in init.params.params]
    if "config" not in names:
        raise ctx.refuse(
            f"{cls.name.value}.__init__ takes no config argument to read {key} from",
            init,
            module,
        )
    stmt = parse_statement(f"self.{key} = config.{key}", module)
    key_id, edit = append_statements_edit(init, [stmt])
    return {key_id: edit}
