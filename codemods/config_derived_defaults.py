"""config-derived-defaults: config fields derived in __post_init__ default to None."""

from __future__ import annotations

import libcst as cst

from autoport_cst.transform import Codemod, Example, FileContext
from autoport_cst.transform.config_reading import dataclass_fields, derived_when_none
from autoport_cst.transform.cst_helpers import parse_expr, rewrite


class ConfigDerivedDefaults(Codemod):
    """Make a config field that ``__post_init__`` derives when it is None
    default to None, so the derivation runs whenever the model config does not
    set the field.

    A config dataclass built by ``from_configs`` keeps only the keys the
    model's config has. With ``head_dim: int = 64`` and ``if self.head_dim is
    None: self.head_dim = hidden_size // num_attention_heads``, a model config
    without ``head_dim`` (transformers 5 writes none for Qwen2) keeps 64. The
    field becomes ``head_dim: int | None = None``; a config that sets it reads
    the same value as before. This is the fix of lint rule NRN006, run by
    ``apply`` as a repair step on a reference that needs it.
    """

    ID = "config-derived-defaults"
    FILES = ("config",)
    TOUCHES = ()
    EXAMPLES = (
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
        edits = {}
        for cls in (s for s in module.body if isinstance(s, cst.ClassDef)):
            fields = dataclass_fields(cls)
            for name in derived_when_none(cls):
                field = fields.get(name)
                if field is None or field.default is None or field.default_is_none:
                    continue
                edits[id(field.statement.body[0])] = _optional_none(field.annotation, module)
        return rewrite(module, edits) if edits else module  # type: ignore[return-value]


def _optional_none(annotation: cst.BaseExpression, module: cst.Module):
    text = module.code_for_node(annotation)
    optional = "None" in text.replace(" ", "").split("|") or text.startswith("Optional")
    new_annotation = annotation if optional else parse_expr(f"{text} | None", module)

    def edit(updated: cst.AnnAssign) -> cst.AnnAssign:
        return updated.with_changes(
            annotation=updated.annotation.with_changes(annotation=new_annotation),
            value=cst.Name("None"),
        )

    return edit
