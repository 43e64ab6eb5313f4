"""demo-marker: a codemod that exists only to show what adding one takes.

tests/codemods/test_new_codemod.py puts this directory on the codemod
package's path, as if this file were added to ``codemods/``, and checks that
the library, the composer, the README table, the property tests and the
plan's pitfalls pick it up with no other file edited."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import libcst as cst

from autoport_cst.spec.pitfalls import Pitfall
from autoport_cst.transform import Codemod, Example, FileContext
from autoport_cst.transform.cst.roles import class_role
from autoport_cst.transform.cst.snippets import parse_statement
from autoport_cst.transform.cst.vocabulary import is_docstring
from autoport_cst.transform.realizes import Realizes, to

ID = "demo-marker"


@dataclass(frozen=True)
class DemoMarkerParams:
    learned: bool = field(default=True, metadata={"doc": "The value the marker holds."})
    source: Literal["config", "checkpoint"] = field(default="config", metadata={"doc": "Where it was read."})


class DemoMarker(Codemod):
    """Mark the causal-LM class as having learned positions (a demonstration).

    Adds ``learned_positions = <learned>  # <source>`` as the first statement
    (after the docstring) of the ``<Prefix>ForCausalLM`` class; a file without
    that class is refused.
    """

    ID = ID
    REALIZES = Realizes({"embedding.learned_positions": to(True)})
    Params = DemoMarkerParams
    PITFALLS = (
        Pitfall(
            1000,
            lambda spec, facts: spec.embedding.learned_positions,
            "learned positions (demo-marker): the position table is a checkpoint tensor",
        ),
    )
    EXAMPLES = (
        Example(
            before="""
            class LlamaForCausalLM:
                pass
            """,
            after="""
            class LlamaForCausalLM:
                learned_positions = True  # config
                pass
            """,
        ),
        Example(before="x = 1\n", raises="demo-marker: no <Prefix>ForCausalLM class"),
    )

    def transform_module(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        targets = [
            s for s in module.body if isinstance(s, cst.ClassDef) and class_role(s.name.value) == "causal_lm"
        ]
        if not targets:
            raise ctx.precondition(f"{ID}: no <Prefix>ForCausalLM class in this file")
        marker = parse_statement(f"learned_positions = {self.params.learned}  # {self.params.source}", module)
        body = []
        for statement in module.body:
            if statement in targets and not _marked(statement):
                statement = _with_marker(statement, marker, module, ctx)
            body.append(statement)
        return module.with_changes(body=body)


def _with_marker(cls: cst.ClassDef, marker: cst.BaseStatement, module: cst.Module, ctx: FileContext):
    block = cls.body
    if not isinstance(block, cst.IndentedBlock):
        raise ctx.precondition(f"{ID}: {cls.name.value} is defined on one line", cls, module)
    at = 1 if block.body and is_docstring(block.body[0]) else 0
    return cls.with_changes(body=block.with_changes(body=[*block.body[:at], marker, *block.body[at:]]))


def _marked(cls: cst.ClassDef) -> bool:
    return any(
        isinstance(s, cst.SimpleStatementLine)
        and isinstance(s.body[0], cst.Assign)
        and isinstance(s.body[0].targets[0].target, cst.Name)
        and s.body[0].targets[0].target.value == "learned_positions"
        for s in cls.body.body
    )
