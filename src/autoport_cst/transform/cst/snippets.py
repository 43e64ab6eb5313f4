"""Code snippets parsed into nodes, with the target module's config (its
indentation and newlines), so that generated code reads like the code around it."""

from __future__ import annotations

import libcst as cst


def parse_statements(code: str, module: cst.Module | None = None) -> list[cst.BaseStatement]:
    """Parse statements with the module's indentation and newline style."""
    config = module.config_for_parsing if module is not None else cst.PartialParserConfig()
    parsed = cst.parse_module(code if code.endswith("\n") else code + "\n", config)
    return list(parsed.body)


def parse_statement(code: str, module: cst.Module | None = None) -> cst.BaseStatement:
    stmts = parse_statements(code, module)
    assert len(stmts) == 1, code
    return stmts[0]


def parse_expr(code: str, module: cst.Module | None = None) -> cst.BaseExpression:
    config = module.config_for_parsing if module is not None else cst.PartialParserConfig()
    return cst.parse_expression(code, config)
