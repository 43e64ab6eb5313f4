"""NRN007 config-rope-theta-top-level."""

from __future__ import annotations

import libcst as cst

from autoport_cst.lint.diagnostics import WARNING
from autoport_cst.lint.rule import Invalid, Rule, Valid
from autoport_cst.transform.anatomy.config import dataclass_fields, mentions


class ConfigRopeThetaTopLevel(Rule):
    """A config dataclass with a top-level ``rope_theta`` field, in a module
    that never reads ``rope_parameters``.

    Why: transformers 5 no longer writes ``rope_theta`` at the top of a model
    config; it keeps the RoPE base (and the scaling) in ``rope_parameters``.
    ``from_configs`` keeps only the keys the config has, so the field silently
    keeps its default: a Qwen3 config read this way rotates with base
    1,000,000 whatever the checkpoint says, and every attention layer differs
    from transformers.

    Fix: the ``config-rope-parameters`` codemod reads the base from
    ``rope_parameters`` when the config has them (and refuses RoPE parameters
    given per layer type, which a single field cannot hold). ``apply`` runs it
    as a repair step when a reference has this problem.

    Example::

        rope_theta: float = 1_000_000.0          # NRN007 (nothing reads rope_parameters)
    """

    CODE = "NRN007"
    NAME = "config-rope-theta-top-level"
    MESSAGE = "rope_theta is read from the top level of the model config"
    FIX = "config-rope-parameters"
    REPAIR = True

    VALID = (
        Valid(
            """
            @dataclass
            class LlamaConfig:
                rope_theta: float = 500000.0
                rope_parameters: dict | None = None

                def __post_init__(self):
                    if self.rope_parameters:
                        self.rope_theta = self.rope_parameters.get("rope_theta", self.rope_theta)
            """,
            path="config.py",
        ),
        Valid(
            """
            def _rope_values(values):
                return values.get("rope_parameters") or {}


            @dataclass
            class LlamaConfig:
                rope_theta: float = 500000.0
            """,
            path="config.py",
            title="read by a helper of the module",
        ),
        Valid(
            """
            class NotADataclass:
                rope_theta: float = 10000.0
            """,
            path="config.py",
        ),
    )
    INVALID = (
        Invalid(
            """
            @dataclass
            class Qwen3Config:
                hidden_size: int = 64
                rope_theta: float = 1_000_000.0
            """,
            at=((4, 5),),
            severity=WARNING,
            message="rope_parameters",
            fixable=True,
            path="config.py",
        ),
    )

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        field = dataclass_fields(node).get("rope_theta")
        # a helper of the module may read them for the class (from_configs calls it)
        if field is None or mentions(self.ctx.module, "rope_parameters"):
            return
        self.report(
            field.statement,
            "config field `rope_theta` is read from the top level of the model config, where "
            "transformers 5 no longer writes it (it is in `rope_parameters`): the field silently "
            "keeps its default",
            severity=WARNING,
        )
