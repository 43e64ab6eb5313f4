"""Hypothesis strategies for a codemod's parameters, derived from its
``Params`` dataclass, so a new codemod is property-tested without a registry
entry here:

- a ``bool`` field takes both values, a ``Literal`` field each of its choices;
- any other field keeps its default, or takes one of the values its field
  metadata lists under ``"examples"`` (declared by the codemod, for what a
  type cannot say: config keys, checkpoint renames);
- combinations the codemod's ``check_params`` refuses are not drawn.

Drawn parameters are JSON-like dicts (what a plan holds), with only the
fields that were drawn."""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, Literal

from hypothesis import strategies as st

from autoport_cst.errors import InputError
from autoport_cst.transform.base import Codemod


def field_values(f: dataclasses.Field, hint: Any) -> tuple[Any, ...] | None:
    """The values a parameter takes in property tests (None: its default only)."""
    if typing.get_origin(hint) is Literal:
        return typing.get_args(hint)
    if hint is bool:
        return (False, True)
    examples = tuple(f.metadata.get("examples", ()))
    if not examples:
        return None
    default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
    return (default, *examples)


def _accepted(cls: type[Codemod], params: dict[str, Any]) -> bool:
    try:
        cls.parse_params(params)
    except InputError:
        return False
    return True


def params_strategy(cls: type[Codemod]) -> st.SearchStrategy[dict[str, Any]]:
    """Parameters of ``cls`` that it accepts, as a plan would give them."""
    hints = typing.get_type_hints(cls.Params)
    drawn = {}
    for f in dataclasses.fields(cls.Params):
        values = field_values(f, hints[f.name])
        if values is not None:
            drawn[f.name] = st.sampled_from(values)
    return st.fixed_dictionaries(drawn).filter(lambda params: _accepted(cls, params))
