"""NRN008 config-field-alias."""

from __future__ import annotations

import libcst as cst

from autoport_cst.lint.diagnostics import WARNING
from autoport_cst.lint.rule import Invalid, Rule, Valid
from autoport_cst.transform.anatomy.config import aliased_fields


class ConfigFieldAlias(Rule):
    """A config dataclass field named as transformers only aliases it, in a
    module that never reads the name transformers writes.

    Why: a transformers config class may answer to a second name for a field
    (its ``attribute_map``: ``Qwen3MoeConfig.num_experts`` reads
    ``num_local_experts``), but ``to_dict()`` and ``config.json`` carry only
    the name it maps to. ``from_configs`` keeps the keys of that dict that are
    fields, so the field keeps its default: a Qwen3-MoE config read this way
    has 128 experts whatever the checkpoint holds. The names come from the
    installed transformers' source, for the transformers class named like the
    dataclass: its ``attribute_map``, and the properties of the base config
    class that read and write another attribute (``torch_dtype``, written as
    ``dtype`` by transformers 5: a ``torch_dtype`` field read from
    ``to_dict()`` stays bfloat16 for a float32 checkpoint). ``torch.dtype``
    in an annotation is no read of ``dtype``. Without transformers the rule
    reports nothing.

    Fix: the ``config-written-names`` codemod copies each such field from the
    name transformers writes when the config has no value under the field's
    own name. ``apply`` runs it as a repair step when a reference has this
    problem.

    Example::

        num_experts: int = 128          # NRN008 (transformers writes num_local_experts)
    """

    CODE = "NRN008"
    NAME = "config-field-alias"
    MESSAGE = "a config field is read under a name transformers does not write"
    FIX = "config-written-names"
    REPAIR = True

    VALID = (
        Valid(
            """
            _ALIASES = {"num_experts": ("num_experts", "num_local_experts")}


            @dataclass
            class Qwen3MoeConfig:
                num_experts: int = 128
            """,
            path="config.py",
            title="the module reads the written name too",
        ),
        Valid(
            """
            @dataclass
            class Qwen3MoeConfig:
                num_local_experts: int = 128
            """,
            path="config.py",
        ),
    )
    INVALID = (
        Invalid(
            """
            @dataclass
            class Qwen3MoeConfig:
                hidden_size: int = 64
                num_experts: int = 128
            """,
            at=((4, 5),),
            severity=WARNING,
            message="num_local_experts",
            fixable=True,
            path="config.py",
        ),
    )

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        for field, written in aliased_fields(node, self.ctx.module):
            self.report(
                field.statement,
                f"config field `{field.name}` is an alias of transformers' {node.name.value}: "
                f"its config.json and to_dict() write `{written}`, so the field silently keeps "
                "its default",
                severity=WARNING,
            )
