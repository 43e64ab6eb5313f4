"""config-derived-defaults: config fields derived in __post_init__ default to None."""

from __future__ import annotations

import libcst as cst

from autoport_cst.transform import Codemod, Example, FileContext
from autoport_cst.transform.anatomy.config import KNOWN_DERIVATIONS, derived_when_none, fixed_defaults
from autoport_cst.transform.cst.snippets import parse_expr, parse_statement
from autoport_cst.transform.edit.config_fields import prepend_to_post_init
from autoport_cst.transform.edit.tree import rewrite


class ConfigDerivedDefaults(Codemod):
    """Make a config field that must be derived when the model config does not
    set it default to None, and derive it in ``__post_init__`` when None.

    A config dataclass built by ``from_configs`` keeps only the keys the
    model's config has. With ``head_dim: int = 64`` and ``if self.head_dim is
    None: self.head_dim = hidden_size // num_attention_heads``, a model config
    without ``head_dim`` (transformers 5 writes none for Qwen2) keeps 64. The
    field becomes ``head_dim: int | None = None``; a config that sets it reads
    the same value as before. A field transformers derives that
    ``__post_init__`` does not (``num_key_value_heads``, which is
    ``num_attention_heads`` for a config without it, as GPT-NeoX's) also gets
    its derivation. This is the fix of lint rule NRN006, run by ``apply`` as a
    repair step on a reference that needs it.
    """

    ID = "config-derived-defaults"
    PURPOSE = "repair"
    FILES = ("config",)
    TOUCHES = ()
    EXAMPLES = (
        Example(
            title="a key-value head count for configs without one",
            role="config",
            path="config.py",
            before="""
                @dataclass
                class LlamaConfig:
                    hidden_size: int = 2048
                    num_attention_heads: int = 32
                    num_key_value_heads: int = 8
            """,
            after="""
                @dataclass
                class LlamaConfig:
                    hidden_size: int = 2048
                    num_attention_heads: int = 32
                    num_key_value_heads: int | None = None

                    def __post_init__(self):
                        if self.num_key_value_heads is None:
                            self.num_key_value_heads = self.num_attention_heads
            """,
        ),
        Example(
            title="a head size that a config without head_dim must derive",
            role="config",
            path="config.py",
            before="""
                @dataclass
                class Qwen3Config:
                    hidden_size: int = 5120
                    num_attention_heads: int = 64
                    head_dim: int = 128

                    def __post_init__(self):
                        if self.head_dim is None:
                            self.head_dim = self.hidden_size // self.num_attention_heads
            """,
            after="""
                @dataclass
                class Qwen3Config:
                    hidden_size: int = 5120
                    num_attention_heads: int = 64
                    head_dim: int | None = None

                    def __post_init__(self):
                        if self.head_dim is None:
                            self.head_dim = self.hidden_size // self.num_attention_heads
            """,
        ),
    )

    def transform_module(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        classes = [s for s in module.body if isinstance(s, cst.ClassDef) and fixed_defaults(s)]
        if not classes:
            return module
        return rewrite(module, {id(c): lambda updated: _repaired(updated, module) for c in classes})  # type: ignore[return-value]


def _repaired(cls: cst.ClassDef, module: cst.Module) -> cst.ClassDef:
    """Fixed defaults made None, and derived in ``__post_init__`` when None."""
    fields = fixed_defaults(cls)
    missing = [f.name for f in fields if f.name not in derived_when_none(cls)]
    body = [
        s.with_changes(body=[_none_default(s.body[0], module)])
        if any(s is f.statement for f in fields)
        else s
        for s in cls.body.body  # type: ignore[union-attr]
    ]
    derivations = [
        parse_statement(f"if self.{name} is None:\n    self.{name} = {KNOWN_DERIVATIONS[name]}", module)
        for name in missing
    ]
    return cls.with_changes(body=cls.body.with_changes(body=prepend_to_post_init(body, derivations, module)))


def _none_default(assign: cst.AnnAssign, module: cst.Module) -> cst.AnnAssign:
    text = module.code_for_node(assign.annotation.annotation)
    optional = "None" in text.replace(" ", "").split("|") or text.startswith("Optional")
    annotation = assign.annotation.annotation if optional else parse_expr(f"{text} | None", module)
    return assign.with_changes(
        annotation=assign.annotation.with_changes(annotation=annotation), value=cst.Name("None")
    )
