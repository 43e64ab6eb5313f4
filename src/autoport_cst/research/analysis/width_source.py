"""The config fields an MLP's ``__init__`` computes its width from.

Most MLPs build their projections ``config.intermediate_size`` wide (read
directly, or through ``self.intermediate_size``, or a parameter defaulting to
it). LFM2's derives the width by a formula (``int(2 * intermediate_size / 3)``
times ``block_ffn_dim_multiplier``, rounded up to ``block_multiple_of``, when
``block_auto_adjust_ff_dim``): 256 built where the config says 128. Research
names those fields so that a refusal says what the width is computed from,
not only that it differs. Read from the class's source: the statements
assigning the name (or ``self`` attribute) passed as a projection's output
width, and the ``if`` tests that enclose them.
"""

from __future__ import annotations

import ast

from autoport_cst.research.interp.values import Instance, SourceClass


def _target(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
        return f"self.{node.attr}"
    return None


def _config_reads(node: ast.AST) -> set[str]:
    return {
        n.attr
        for n in ast.walk(node)
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "config"
    }


def _assignments(
    body: list[ast.stmt], tests: tuple[ast.expr, ...]
) -> list[tuple[ast.stmt, tuple[ast.expr, ...]]]:
    """Every statement of ``body`` (into ``if`` branches) with the ``if`` tests enclosing it."""
    found: list[tuple[ast.stmt, tuple[ast.expr, ...]]] = []
    for stmt in body:
        if isinstance(stmt, ast.If):
            found += _assignments(stmt.body, (*tests, stmt.test))
            found += _assignments(stmt.orelse, (*tests, stmt.test))
        else:
            found.append((stmt, tests))
    return found


def _out_width(call: ast.Call) -> ast.expr | None:
    for keyword in call.keywords:
        if keyword.arg == "out_features":
            return keyword.value
    return call.args[1] if len(call.args) > 1 else None


def width_fields(mlp: Instance) -> tuple[str, ...]:
    """The config fields the first projection's output width of ``mlp``'s
    ``__init__`` is computed from (sorted), or () when not read."""
    if not isinstance(mlp.cls, SourceClass):
        return ()
    init = next(
        (n for n in mlp.cls.node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None
    )
    if init is None:
        return ()
    statements = _assignments(init.body, ())
    calls = [
        n
        for stmt, _ in statements
        for n in ast.walk(stmt)
        if isinstance(n, ast.Call)
        and isinstance(n.func, (ast.Attribute, ast.Name))
        and _out_width(n) is not None
        and (n.func.attr if isinstance(n.func, ast.Attribute) else n.func.id) == "Linear"
    ]
    width = _out_width(calls[0]) if calls else None
    if width is None:
        return ()
    fields = _config_reads(width)
    names = {t for t in [_target(width)] if t is not None}
    for stmt, tests in reversed(statements):  # a later statement reads earlier ones
        if not isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign)) or stmt.value is None:
            continue
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
        value = stmt.value
        if any(_target(t) in names for t in targets):
            fields |= _config_reads(value) | {f for test in tests for f in _config_reads(test)}
            names |= {
                t
                for n in ast.walk(value)
                if isinstance(n, (ast.Name, ast.Attribute))
                for t in [_target(n)]
                if t is not None
            }
    return tuple(sorted(fields))
