"""Where a config dataclass's ``from_configs`` holds the model config as a
dict (read only; the codemods that check or rewrite the model config's
values before the dataclass is built use it).

``from_configs(cls, hf_config, ...)`` turns the Hugging Face config (a
``PretrainedConfig``, a dict or a JSON path) into a dict and keeps the keys
that are fields. The dict is the local this module finds:

- the local named ``values`` (our references' convention), or
- a local assigned ``<config>.to_dict()`` or ``dict(<config>)`` somewhere in
  the method, ``<config>`` being its first parameter after ``cls``, whatever
  the other branches bind it to (a JSON file read, the dict as given): the
  production packages name it ``config_dict`` and bind it in an
  ``if``/``elif``/``else`` on the config's type, one branch nesting another.

The statement after which the dict can be read is the last top-level
statement of the method that binds it before the first that reads it (a
rebinding, conditional or not, comes before the read), once some statement
has bound it on every path through it (every branch of an ``if`` with an
``else``, the body of a ``with``, the body and each handler of a ``try``; a
branch that returns or raises never reaches the next statement). A local
bound only on some paths is reported as such.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import libcst as cst

from autoport_cst.transform.cst.vocabulary import walk

CONVENTIONAL = "values"


@dataclass(frozen=True)
class ConfigValues:
    """The local holding the model config's dict, and the top-level statement
    of ``from_configs`` after which it holds the dict the method reads (None:
    bound on some paths only, ``partial`` then the first statement that
    binds it)."""

    name: str
    statement: cst.BaseStatement | None
    partial: cst.BaseStatement | None = None


def config_values(method: cst.FunctionDef) -> ConfigValues | None:
    """The model config's dict in ``from_configs`` (None: no such local)."""
    name = _dict_name(method)
    if name is None:
        return None
    anchor = everywhere = partial = None
    for stmt in _statements(method.body):
        if not any(_target(n) == name for n in walk(stmt)):
            if anchor is not None and any(isinstance(n, cst.Name) and n.value == name for n in walk(stmt)):
                break  # read: the dict the guard must see is the one bound so far
            continue
        partial = partial or stmt
        everywhere = everywhere or (stmt if _bound(stmt, name) else None)
        anchor = stmt
    return ConfigValues(name, anchor if everywhere is not None else None, partial)


def _dict_name(method: cst.FunctionDef) -> str | None:
    targets = [n for n in walk(method) if isinstance(n, cst.Assign)]
    names = [_target(t) for a in targets for t in a.targets]
    if CONVENTIONAL in names:
        return CONVENTIONAL
    params = method.params.params
    config = params[1].name.value if len(params) > 1 else None
    if config is None:
        return None
    for assign in targets:
        if _is_config_dict(assign.value, config):
            name = next((_target(t) for t in assign.targets if _target(t) is not None), None)
            if name is not None:
                return name
    return None


def _target(node: cst.CSTNode) -> str | None:
    if isinstance(node, cst.AssignTarget) and isinstance(node.target, cst.Name):
        return node.target.value
    return None


def _is_config_dict(value: cst.BaseExpression, config: str) -> bool:
    """``<config>.to_dict()`` or ``dict(<config>)``."""
    if not isinstance(value, cst.Call):
        return False
    func = value.func
    if isinstance(func, cst.Attribute) and func.attr.value == "to_dict" and not value.args:
        return isinstance(func.value, cst.Name) and func.value.value == config
    if isinstance(func, cst.Name) and func.value == "dict" and len(value.args) == 1:
        arg = value.args[0].value
        return isinstance(arg, cst.Name) and arg.value == config
    return False


def _bound(stmt: cst.BaseStatement, name: str) -> bool:
    """Whether every path through ``stmt`` that reaches the next statement
    binds ``name``."""
    if isinstance(stmt, cst.SimpleStatementLine):
        return _line_bound(stmt.body, name)
    if isinstance(stmt, cst.If):
        orelse = stmt.orelse
        if orelse is None:
            return False
        other = _bound(orelse, name) if isinstance(orelse, cst.If) else _block_bound(orelse.body, name)
        return _block_bound(stmt.body, name) and other
    if isinstance(stmt, cst.With):
        return _block_bound(stmt.body, name)
    if isinstance(stmt, cst.Try):
        return _block_bound(stmt.body, name) and all(_block_bound(h.body, name) for h in stmt.handlers)
    return False


def _block_bound(block: cst.BaseSuite, name: str) -> bool:
    if isinstance(block, cst.SimpleStatementSuite):
        return _line_bound(block.body, name)
    return any(_bound(stmt, name) for stmt in _statements(block))


def _line_bound(body: Sequence[cst.BaseSmallStatement], name: str) -> bool:
    """A line that assigns ``name``, or returns or raises (its path ends)."""
    return any(
        isinstance(small, (cst.Return, cst.Raise))
        or (isinstance(small, cst.Assign) and any(_target(t) == name for t in small.targets))
        for small in body
    )


def _statements(block: cst.BaseSuite) -> list[cst.BaseStatement]:
    return list(block.body) if isinstance(block, cst.IndentedBlock) else []
