"""Keyword arguments of calls: set, insert, remove, in the call's own layout.

Insertion positions are deterministic whatever order codemods run in: a new
keyword goes before the first keyword that follows it in ``order`` (a kernel's
signature), or right after the first present keyword of ``after``, or last. A
multi-line call keeps one argument per line and its trailing comma.
"""

from __future__ import annotations

import libcst as cst

from autoport_cst.transform.cst.vocabulary import keyword_arg


def keyword(name: str, value: cst.BaseExpression) -> cst.Arg:
    """``name=value`` with no spaces around ``=``."""
    return cst.Arg(
        keyword=cst.Name(name),
        value=value,
        equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")),
    )


def _separator(args: list[cst.Arg], before: int) -> cst.Comma:
    """The comma that separates arguments here: the one before ``before``,
    else the call's first, else ``, ``."""
    candidates = [args[before - 1].comma] if 0 < before <= len(args) else []
    candidates += [a.comma for a in args[:-1]]
    for comma in candidates:
        if isinstance(comma, cst.Comma):
            return comma
    return cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))


def set_keyword(
    call: cst.Call,
    name: str,
    value: cst.BaseExpression,
    *,
    after: tuple[str, ...] = (),
    order: tuple[str, ...] = (),
) -> cst.Call:
    """``call`` with ``name=value``: the value replaced when the keyword is
    present (the call itself when equal), otherwise a new argument placed by
    ``order`` or ``after`` (see the module docstring), else last."""
    existing = keyword_arg(call, name)
    if existing is not None:
        if existing.value.deep_equals(value):
            return call
        return call.with_changes(
            args=[a.with_changes(value=value) if a is existing else a for a in call.args]
        )
    args = list(call.args)
    position = len(args)
    if name in order:
        later = set(order[order.index(name) + 1 :])
        position = next(
            (i for i, a in enumerate(args) if a.keyword is not None and a.keyword.value in later), position
        )
    else:
        for anchor_name in after:
            anchor = keyword_arg(call, anchor_name)
            if anchor is not None:
                position = args.index(anchor) + 1
                break
    new = keyword(name, value)
    if position < len(args):
        args.insert(position, new.with_changes(comma=_separator(args, position)))
        return call.with_changes(args=args)
    if not args:
        return call.with_changes(args=[new])
    last = args[-1]
    if isinstance(last.comma, cst.Comma):  # a trailing comma: it leads to ")"
        args[-1] = last.with_changes(comma=_separator(args, len(args) - 1))
        args.append(new.with_changes(comma=last.comma))
    else:
        args[-1] = last.with_changes(comma=_separator(args, len(args) - 1))
        args.append(new)
    return call.with_changes(args=args)


def remove_keyword(call: cst.Call, name: str) -> cst.Call:
    """``call`` without its ``name=`` argument (unchanged when absent)."""
    arg = keyword_arg(call, name)
    if arg is None:
        return call
    args = [a for a in call.args if a is not arg]
    if args and call.args[-1] is arg:  # the new last argument ends like the old one
        args[-1] = args[-1].with_changes(comma=arg.comma)
    return call.with_changes(args=args)
