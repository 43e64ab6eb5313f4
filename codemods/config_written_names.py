"""config-written-names: config fields that transformers only aliases also read the name it writes."""

from __future__ import annotations

import libcst as cst

from autoport_cst.transform import Codemod, Example, FileContext
from autoport_cst.transform.anatomy.config import aliased_fields
from autoport_cst.transform.cst.snippets import parse_statement
from autoport_cst.transform.edit.config_fields import prepend_to_post_init
from autoport_cst.transform.edit.tree import rewrite


class ConfigWrittenNames(Codemod):
    """Give a config field that transformers only aliases a companion field
    under the name transformers writes, and let ``__post_init__`` take the
    value from it when the model config has one.

    transformers' ``Qwen3MoeConfig`` answers to ``num_experts`` but writes
    ``num_local_experts`` to ``config.json`` and ``to_dict()``. A config
    dataclass whose ``from_configs`` keeps the keys that are fields never
    sees ``num_experts`` and keeps its default. With a
    ``num_local_experts: int | None = None`` field beside it (kept by
    ``from_configs`` like any other), ``__post_init__`` copies that value
    into ``num_experts``; a config written under the old name reads as
    before. The aliases come from the installed transformers (lint rule
    NRN008), its base config class's too: ``torch_dtype``, which
    transformers 5 writes as ``dtype``, by name (``"float32"``): a
    ``torch.dtype`` field takes ``getattr(torch, name)``. ``apply`` runs this
    as a repair step on a reference that needs it.
    """

    ID = "config-written-names"
    PURPOSE = "repair"
    FILES = ("config",)
    TOUCHES = ()
    EXAMPLES = (
        Example(
            title="the expert count of a Qwen3-MoE config",
            role="config",
            path="config.py",
            before="""
                @dataclass
                class Qwen3MoeConfig:
                    hidden_size: int = 2048
                    num_experts: int = 128

                    def __post_init__(self):
                        self.head_dim = self.hidden_size // 32
            """,
            after="""
                @dataclass
                class Qwen3MoeConfig:
                    hidden_size: int = 2048
                    num_experts: int = 128
                    # transformers writes `num_experts` as `num_local_experts`
                    num_local_experts: int | None = None

                    def __post_init__(self):
                        if self.num_local_experts is not None:
                            self.num_experts = self.num_local_experts
                        self.head_dim = self.hidden_size // 32
            """,
        ),
        Example(
            title="the dtype, which transformers 5 writes as dtype by name",
            role="config",
            path="config.py",
            before="""
                import torch


                @dataclass
                class Qwen3MoeConfig:
                    hidden_size: int = 2048
                    torch_dtype: torch.dtype = torch.bfloat16
                    num_local_experts: int = 128
            """,
            after="""
                import torch


                @dataclass
                class Qwen3MoeConfig:
                    hidden_size: int = 2048
                    torch_dtype: torch.dtype = torch.bfloat16
                    # transformers writes `torch_dtype` as `dtype`
                    dtype: torch.dtype | str | None = None
                    num_local_experts: int = 128

                    def __post_init__(self):
                        if self.dtype is not None:
                            self.torch_dtype = getattr(torch, self.dtype.replace("torch.", "")) if isinstance(self.dtype, str) else self.dtype
            """,
        ),
    )

    def transform_module(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        classes = [s for s in module.body if isinstance(s, cst.ClassDef) and aliased_fields(s, module)]
        if not classes:
            return module
        return rewrite(module, {id(c): lambda updated: _repaired(updated, module) for c in classes})  # type: ignore[return-value]


def _repaired(cls: cst.ClassDef, module: cst.Module) -> cst.ClassDef:
    """A companion field after each aliased one; its copy in ``__post_init__``."""
    pairs = {field.statement: written for field, written in aliased_fields(cls, module)}
    body: list[cst.BaseStatement] = []
    for statement in cls.body.body:  # type: ignore[union-attr]
        body.append(statement)
        if statement in pairs:
            body.append(_companion(statement, pairs[statement], module))
    copies = [parse_statement(_copy(s, w, module), module) for s, w in pairs.items()]
    return cls.with_changes(body=cls.body.with_changes(body=prepend_to_post_init(body, copies, module)))


def _copy(statement: cst.SimpleStatementLine, written: str, module: cst.Module) -> str:
    """The copy of the written name into the field; a ``torch.dtype`` field
    takes the dtype's name, as ``to_dict()`` writes it (``"float32"``)."""
    value = f"self.{written}"
    if _annotation(statement, module) == "torch.dtype":
        value = f'getattr(torch, {value}.replace("torch.", "")) if isinstance({value}, str) else {value}'
    return f"if self.{written} is not None:\n    self.{_name(statement)} = {value}"


def _annotation(statement: cst.SimpleStatementLine, module: cst.Module) -> str:
    return module.code_for_node(statement.body[0].annotation.annotation)  # type: ignore[union-attr]


def _name(statement: cst.SimpleStatementLine) -> str:
    return statement.body[0].target.value  # type: ignore[union-attr, attr-defined]


def _companion(statement: cst.SimpleStatementLine, written: str, module: cst.Module) -> cst.BaseStatement:
    annotation = _annotation(statement, module)
    if annotation == "torch.dtype":
        annotation = "torch.dtype | str"  # to_dict() writes a dtype by name
    field = parse_statement(f"{written}: {annotation} | None = None", module)
    comment = cst.EmptyLine(comment=cst.Comment(f"# transformers writes `{_name(statement)}` as `{written}`"))
    return field.with_changes(leading_lines=[comment])
