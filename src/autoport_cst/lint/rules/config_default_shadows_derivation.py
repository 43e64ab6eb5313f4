"""NRN006 config-default-shadows-derivation."""

from __future__ import annotations

import libcst as cst

from autoport_cst.lint.diagnostics import WARNING
from autoport_cst.lint.rule import Invalid, Rule, Valid
from autoport_cst.transform.anatomy.config import KNOWN_DERIVATIONS, derived_when_none, fixed_defaults


class ConfigDefaultShadowsDerivation(Rule):
    """A config dataclass field with a fixed default that should be derived
    when the model config does not set it: one ``__post_init__`` derives only
    when it is None (``head_dim: int = 64`` beside ``if self.head_dim is None:
    self.head_dim = self.hidden_size // self.num_attention_heads``), or one
    transformers derives (``num_key_value_heads`` is ``num_attention_heads``
    when a config has none, as GPT-NeoX's).

    Why: ``from_configs`` keeps the keys the model's config has. A config
    without the field (transformers 5 writes no ``head_dim`` for Qwen2, for
    example) leaves the default in place, the derivation never runs, and the
    port computes with a head size of 64 whatever the model's is: it fails to
    load, or worse, loads and computes something else.

    Fix: the ``config-derived-defaults`` codemod makes such defaults None and
    derives the field in ``__post_init__`` when it is None. ``apply``
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
        Invalid(
            """
            @dataclass
            class LlamaConfig:
                hidden_size: int = 64
                num_attention_heads: int = 4
                num_key_value_heads: int = 8
            """,
            at=((5, 32),),
            severity=WARNING,
            message="num_attention_heads",
            fixable=True,
            path="config.py",
            title="a key-value head count transformers derives",
        ),
    )

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        derived = set(derived_when_none(node))
        for field in fixed_defaults(node):
            if field.default is None:  # pragma: no cover - fixed_defaults have one
                continue
            default = self.ctx.module.code_for_node(field.default)
            if field.name in derived:
                why = f"so `__post_init__` never derives it: a model config without `{field.name}` gets {default}"
            else:
                why = (
                    f"while transformers derives it when a model config does not set it "
                    f"(`{KNOWN_DERIVATIONS[field.name]}`): such a config gets {default}"
                )
            self.report(
                field.default,
                f"config field `{field.name}` defaults to {default}, {why} instead of the derived value",
                severity=WARNING,
            )
