"""Module-level functions and methods added from snippets."""

from __future__ import annotations

import libcst as cst

from autoport_cst.transform.cst.snippets import parse_statement


def add_functions(module: cst.Module, functions: list[str], replace: bool = False) -> cst.Module:
    """Add module-level functions (source text) not yet defined, before the
    first class of the module. With ``replace``, a function of the same name
    whose text differs is replaced in place."""
    body = list(module.body)
    changed = False
    for code in functions:
        func = parse_statement(code.strip("\n"), module)
        assert isinstance(func, cst.FunctionDef), code
        name = func.name.value
        existing = next(
            (i for i, s in enumerate(body) if isinstance(s, cst.FunctionDef) and s.name.value == name), None
        )
        if existing is not None:
            old = body[existing]
            if replace and not old.with_changes(leading_lines=[]).deep_equals(
                func.with_changes(leading_lines=[])
            ):
                body[existing] = func.with_changes(leading_lines=old.leading_lines)
                changed = True
            continue
        func = func.with_changes(leading_lines=[cst.EmptyLine(indent=False), cst.EmptyLine(indent=False)])
        first_class = next((i for i, s in enumerate(body) if isinstance(s, cst.ClassDef)), len(body))
        position = first_class
        while (
            position > 0
            and isinstance(previous := body[position - 1], cst.FunctionDef)
            and previous.name.value > name
        ):
            position -= 1
        if position == 0:
            func = func.with_changes(leading_lines=body[0].leading_lines if body else [])
            if body:
                body[0] = body[0].with_changes(
                    leading_lines=[cst.EmptyLine(indent=False), cst.EmptyLine(indent=False)]
                )
        body.insert(position, func)
        changed = True
    return module.with_changes(body=body) if changed else module


def parse_method(code: str, module: cst.Module) -> cst.FunctionDef:
    """A method from source written at module level (``def m(self, ...):``):
    parsed inside a class so that multi-line strings keep the method's
    indentation."""
    import textwrap

    indent = module.default_indent
    wrapped = "class _Holder:\n" + textwrap.indent(code.strip("\n") + "\n", indent)
    holder = parse_statement(wrapped, module)
    assert isinstance(holder, cst.ClassDef)
    func = holder.body.body[0]
    assert isinstance(func, cst.FunctionDef), code
    return func
