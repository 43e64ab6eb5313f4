"""NRN006 config-default-shadows-derivation."""

from __future__ import annotations

import libcst as cst

from autoport_cst.lint.diagnostics import WARNING
from autoport_cst.lint.rule import Invalid, Rule, Valid
from autoport_cst.transform.config_reading import dataclass_fields, derived_when_none


class ConfigDefaultShadowsDerivation(Rule):
    """A config dataclass field with a default, whose ``__post_init__`` derives
    it only when it is None: ``head_dim: int = 64`` beside ``if self.head_dim
    is None: self.head_dim = self.hidden_size // self.num_attention_heads``.

    Why: ``from_configs`` keeps the keys the model's config has. A config
    without the field (transformers 5 writes no ``head_dim`` for Qwen2, for
    example) leaves the default in place, the derivation never runs, and the
    port computes with a head size of 64 whatever the model's is: it fails to
    load, or worse, loads and computes something else.

    Fix: the ``config-derived-defaults`` codemod makes such defaults None, so
    the derivation runs whenever the config does not set the field. ``apply``
    runs it as a repair step when a reference has this problem.

    Example::

        head_dim: int = 64               # NRN006 (derived in __post_init__ when None)
        head_dim: int | None = None      # fine
    """

    CODE = "NRN006"
    NAME = "config-default-shadows-derivation"
    MESSAGE = "a config default hides the derivation in __post_init__"
    FIX = "config-derived-defaults"
    REPAIR = True

    VALID = (
        Valid(
            """
            @dataclass
            class LlamaConfig:
                hidden_size: int = 64
                head_dim: int | None = None

                def __post_init__(self):
                    if self.head_dim is None:
                        self.head_dim = self.hidden_size // 4
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
                head_dim: int = 128

                def __post_init__(self):
                    if self.head_dim is None:
                        self.head_dim = self.hidden_size // 4
            """,
            at=((4, 21),),
            severity=WARNING,
            message="head_dim",
            fixable=True,
            path="config.py",
        ),
    )

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        fields = dataclass_fields(node)
        if not fields:
            return
        for name in derived_when_none(node):
            field = fields.get(name)
            if field is None or field.default is None or field.default_is_none:
                continue
            default = self.ctx.module.code_for_node(field.default)
            self.report(
                field.default,
                f"config field `{name}` defaults to {default}, so `__post_init__` never derives it: "
                f"a model config without `{name}` gets {default} instead of the derived value",
                severity=WARNING,
            )
