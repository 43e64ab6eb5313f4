"""set-constants: set module-level constants to new literal values."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import libcst as cst

from autoport_cst.transform import Codemod, Example, FileContext
from autoport_cst.transform.cst.snippets import parse_expr
from autoport_cst.transform.cst.vocabulary import code_of, simple_assign


@dataclass(frozen=True)
class SetConstantsParams:
    values: dict[str, Any] = field(
        default_factory=dict,
        metadata={"doc": "Constant name -> new value (JSON: string, number, boolean, null, list)."},
    )


def _literal(value: Any) -> str:
    if value is None or isinstance(value, bool):
        return repr(value)
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_literal(v) for v in value) + "]"
    raise TypeError(f"unsupported constant value {value!r}")


class SetConstants(Codemod):
    """Set module-level constants (``NAME = <literal>``) to new values.

    Used for the files a port gets beside its package (the example script and
    the logit test carry the model name and architecture as constants), and
    usable on any module. Each named constant must exist at module level;
    a missing one is a precondition error, so a renamed constant in a
    reference cannot be skipped silently. Values already equal are left as
    they are.
    """

    ID = "set-constants"
    PURPOSE = "every port"
    Params = SetConstantsParams
    FILES = ("companion",)
    EXAMPLES = (
        Example(
            title="model identity in an example script",
            role="companion",
            path="run.py",
            params={"values": {"MODEL_NAME": "qwen2", "TP_SIZE": 4}},
            before="""
                MODEL_NAME = "llama3"  # package under vllm_neuron/model/
                TP_SIZE = 2
            """,
            after="""
                MODEL_NAME = "qwen2"  # package under vllm_neuron/model/
                TP_SIZE = 4
            """,
        ),
        Example(
            title="unknown constant",
            role="companion",
            path="run.py",
            params={"values": {"CHECKPOINT": "x"}},
            before="""
                MODEL_NAME = "llama3"
            """,
            raises="no module-level constant CHECKPOINT",
        ),
    )

    @classmethod
    def check_params(cls, params: SetConstantsParams) -> list[str]:
        problems = []
        for name, value in params.values.items():
            try:
                _literal(value)
            except TypeError:
                problems.append(f"{name}: unsupported value {value!r}")
        return problems

    def transform_module(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        wanted = dict(self.params.values)
        body = list(module.body)
        for index, stmt in enumerate(body):
            pair = simple_assign(stmt)
            if pair is None or not isinstance(pair[0], cst.Name) or pair[0].value not in wanted:
                continue
            name = pair[0].value
            literal = _literal(wanted.pop(name))
            if code_of(pair[1]) == literal:
                continue
            small = stmt.body[0]
            body[index] = stmt.with_changes(body=[small.with_changes(value=parse_expr(literal, module))])
        if wanted:
            raise ctx.precondition(
                f"set-constants: no module-level constant {', '.join(sorted(wanted))} in this file"
            )
        return module.with_changes(body=body)
