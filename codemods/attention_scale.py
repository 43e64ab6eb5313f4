"""attention-scale: an attention score scale from the config instead of head_dim ** -0.5."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

import libcst as cst

from autoport_cst.spec.pitfalls import Pitfall
from autoport_cst.transform import Codemod, Example, FileContext, PortContext
from autoport_cst.transform.anatomy.attention import (
    DECODE,
    FLASH,
    KERNEL_NAMES,
    SEGMENTED,
    SEGMENTED_CP,
    attention_classes_in,
    kernel_sites,
)
from autoport_cst.transform.anatomy.classes import require_method
from autoport_cst.transform.cst.snippets import parse_expr
from autoport_cst.transform.cst.vocabulary import code_of, find_self_assignment, self_assignment
from autoport_cst.transform.edit.config_fields import add_config_fields
from autoport_cst.transform.edit.kernels import argument
from autoport_cst.transform.edit.tree import rewrite, with_comment
from autoport_cst.transform.realizes import Realizes, not_to

ID = "attention-scale"
# where each kernel takes its scale when it is passed by position
SCALE_POSITIONS = {FLASH: 3, SEGMENTED: 7, SEGMENTED_CP: 12}
COMMENT = "<-- MODEL-SPECIFIC: attention score scale from the config (not head_dim ** -0.5)"
CONSTANT_COMMENT = (
    "<-- MODEL-SPECIFIC: attention score scale fixed by the model's code (not head_dim ** -0.5)"
)


@dataclass(frozen=True)
class AttentionScaleParams:
    config_key: str = field(
        default="attention_multiplier",
        metadata={
            "doc": "Config field holding the scale (Granite: attention_multiplier; Gemma: query_pre_attn_scalar); "
            "dotted for a field of a sub-config config.json nests (MPT: attn_config.softmax_scale).",
            "examples": ("query_pre_attn_scalar", "attn_config.softmax_scale"),
        },
    )
    form: Literal["scale", "inverse_sqrt"] = field(
        default="scale",
        metadata={
            "doc": "scale: the field is the scale itself (Granite); inverse_sqrt: the scale is "
            "field ** -0.5 (Gemma's query_pre_attn_scalar)."
        },
    )
    constant: float | None = field(
        default=None,
        metadata={
            "doc": "A scale the model's code fixes whatever the config (GPT-Neo's unscaled scores: 1.0), "
            "written as it is; config_key and form are then not read."
        },
    )


class AttentionScale(Codemod):
    """Scale attention scores by a value from the config instead of ``head_dim ** -0.5``.

    ``config.attention_multiplier`` (Granite),
    ``config.query_pre_attn_scalar ** -0.5`` (Gemma 2 / 3), or a field of a
    sub-config config.json nests (MPT's ``attn_config.softmax_scale``, None
    meaning ``head_dim ** -0.5``): the port's config keeps the sub-config as
    the dict config.json holds (``attn_config: dict | None``) and the
    attention reads the field from it.

    Model file, attention class (``<Prefix>Attention``): the value of
    ``self.scaling`` in ``__init__`` becomes the config expression. Every
    kernel of every path already reads ``self.scaling``: flash, segmented
    and context-parallel prefill pass it as ``scale=``, decode as
    ``softmax_scale=`` (``self.scaling / self.k_scale_float`` with an FP8
    cache), so none of them changes. Config file: the dataclass gains the
    field (``float | None``; a config without it keeps ``head_dim ** -0.5``),
    or the sub-config holding it.

    A scale the model's code fixes (GPT-Neo multiplies its scores by
    nothing: 1.0, whatever the config) is written as that number
    (``constant``), and the config gains no field.

    Preconditions: an attention class whose ``__init__`` sets
    ``self.scaling``, and whose kernel calls each pass a scale (a call left
    to the kernel's default ``head_dim ** -0.5`` would not follow);
    ``config_key`` is a Python identifier, or two joined by a dot.
    """

    ID = ID
    # the scale's config field must be known: a scale the code computes
    # some other way has no realization here
    REALIZES = Realizes(
        dict.fromkeys(("attention.scale", "attention.scale_key", "attention.scale_form"), not_to(None))
    )
    Params = AttentionScaleParams
    NEEDS_REAL_MODEL = True
    PITFALLS = (
        Pitfall(
            100,
            lambda spec, facts: spec.attention.scale is not None,
            "attention scale is {spec.attention.scale:g}, not head_dim ** -0.5: read it from the config",
        ),
    )
    FILES = ("model", "config")
    EXAMPLES = (
        Example(
            title="Granite's attention_multiplier",
            params={"config_key": "attention_multiplier"},
            before="""
                class GraniteAttention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.head_dim = config.head_dim
                        self.scaling = self.head_dim**-0.5
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, self.qkv_size))
            """,
            after="""
                class GraniteAttention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.head_dim = config.head_dim
                        # <-- MODEL-SPECIFIC: attention score scale from the config (not head_dim ** -0.5)
                        self.scaling = (
                            config.attention_multiplier if config.attention_multiplier is not None else self.head_dim**-0.5
                        )
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, self.qkv_size))
            """,
        ),
        Example(
            title="Gemma's query_pre_attn_scalar, and its config field",
            role="config",
            path="config.py",
            params={"config_key": "query_pre_attn_scalar", "form": "inverse_sqrt"},
            before="""
                @dataclass
                class Gemma2Config:
                    head_dim: int | None = None
                    torch_dtype: torch.dtype = torch.bfloat16
            """,
            after="""
                @dataclass
                class Gemma2Config:
                    head_dim: int | None = None
                    # <-- MODEL-SPECIFIC: fields of this architecture's features (sorted by name)
                    # attention score scale: query_pre_attn_scalar ** -0.5
                    query_pre_attn_scalar: float | None = None
                    torch_dtype: torch.dtype = torch.bfloat16
            """,
        ),
        Example(
            title="MPT's attn_config.softmax_scale (None: head_dim ** -0.5)",
            params={"config_key": "attn_config.softmax_scale"},
            before="""
                class MptAttention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.head_dim = config.head_dim
                        self.scaling = self.head_dim**-0.5
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, self.qkv_size))
            """,
            after="""
                class MptAttention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.head_dim = config.head_dim
                        # <-- MODEL-SPECIFIC: attention score scale from the config (not head_dim ** -0.5)
                        self.scaling = (
                            (config.attn_config or {}).get("softmax_scale")
                            if (config.attn_config or {}).get("softmax_scale") is not None
                            else self.head_dim**-0.5
                        )
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, self.qkv_size))
            """,
        ),
        Example(
            title="MPT's sub-config in the config",
            role="config",
            path="config.py",
            params={"config_key": "attn_config.softmax_scale"},
            before="""
                @dataclass
                class MptConfig:
                    head_dim: int | None = None
            """,
            after="""
                @dataclass
                class MptConfig:
                    head_dim: int | None = None
                    # <-- MODEL-SPECIFIC: fields of this architecture's features (sorted by name)
                    # sub-config of the attention score scale: softmax_scale (None: head_dim ** -0.5)
                    attn_config: dict | None = None
            """,
        ),
        Example(
            title="GPT-Neo's unscaled scores: a scale of 1.0 the code fixes",
            params={"constant": 1.0},
            before="""
                class GPTNeoAttention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.head_dim = config.head_dim
                        self.scaling = self.head_dim**-0.5
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, self.qkv_size))
            """,
            after="""
                class GPTNeoAttention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.head_dim = config.head_dim
                        # <-- MODEL-SPECIFIC: attention score scale fixed by the model's code (not head_dim ** -0.5)
                        self.scaling = 1.0
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, self.qkv_size))
            """,
        ),
        Example(
            title="no scaling attribute",
            before="""
                class GraniteAttention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, self.qkv_size))
            """,
            raises="attention-scale: GraniteAttention.__init__ sets no self.scaling",
        ),
    )

    @classmethod
    def check_params(cls, params: AttentionScaleParams) -> list[str]:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?", params.config_key):
            return [f"config_key {params.config_key!r} is not an identifier, nor two joined by a dot"]
        return []

    @classmethod
    def params_for(cls, diffs, target, port: PortContext) -> AttentionScaleParams:
        attention = target.attention
        if attention.scale_key is None:
            scale = attention.scale
            return AttentionScaleParams(constant=float(scale) if isinstance(scale, (int, float)) else None)
        return AttentionScaleParams(
            config_key=attention.scale_key,
            form="inverse_sqrt" if attention.scale_form == "inverse_sqrt" else "scale",
        )

    def _value(self, config: str) -> str:
        if self.params.constant is not None:
            return repr(float(self.params.constant))
        outer, _, inner = self.params.config_key.partition(".")
        field_ = f'({config}.{outer} or {{}}).get("{inner}")' if inner else f"{config}.{outer}"
        scale = field_ if self.params.form == "scale" else f"{field_}**-0.5"
        return f"{scale} if {field_} is not None else self.head_dim**-0.5"

    def transform_module(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        key = self.params.config_key
        if ctx.role == "config" and self.params.constant is not None:
            return module  # the code's own number: no config field
        if ctx.role == "config":
            outer, _, inner = key.partition(".")
            if inner:
                power = "" if self.params.form == "scale" else " ** -0.5"
                comment = f"sub-config of the attention score scale: {inner}{power} (None: head_dim ** -0.5)"
                return add_config_fields(module, ctx, [(f"{outer}: dict | None = None", comment)])
            what = "the scale itself" if self.params.form == "scale" else f"{key} ** -0.5"
            comment = (
                f"attention score scale: {what}"
                if self.params.form == "inverse_sqrt"
                else "attention score scale (None: head_dim ** -0.5)"
            )
            return add_config_fields(module, ctx, [(f"{key}: float | None = None", comment)])
        edits: dict = {}
        for cls in attention_classes_in(module, ctx):
            for site in kernel_sites(cls):
                name = "softmax_scale" if site.kind == DECODE else "scale"
                if argument(site.call, name, SCALE_POSITIONS.get(site.kind)) is None:
                    raise ctx.precondition(
                        f"{ID}: {site.where(cls)}: {KERNEL_NAMES[site.kind]}(...) passes no {name}= "
                        "(the kernel's default head_dim ** -0.5 would stay)",
                        site.call,
                        module,
                    )
            init = require_method(module, ctx, cls, "__init__")
            stmt = find_self_assignment(init, "scaling")
            if stmt is None:
                raise ctx.precondition(f"{ID}: {cls.name.value}.__init__ sets no self.scaling", init, module)
            params = [p.name.value for p in init.params.params]
            config = params[1] if len(params) > 1 else "config"
            value = parse_expr(self._value(config), module)
            current = self_assignment(stmt)[1]
            if code_of(current) == code_of(value) or (
                isinstance(current, cst.IfExp)
                and isinstance(value, cst.IfExp)
                and code_of(current.test) == code_of(value.test)
            ):
                continue
            small = stmt.body[0]
            if isinstance(value, cst.IfExp):
                value = _parenthesized(value, module, one_line="." not in key)
            new = stmt.with_changes(body=[small.with_changes(value=value)])
            comment = COMMENT if self.params.constant is None else CONSTANT_COMMENT
            new = with_comment(new, comment).with_changes(
                leading_lines=[*stmt.leading_lines, *with_comment(new, comment).leading_lines]
            )
            edits[id(stmt)] = lambda updated, new=new: new
        return rewrite(module, edits)


def _parenthesized(value: cst.IfExp, module: cst.Module, one_line: bool) -> cst.IfExp:
    """``value`` in parentheses on lines of its own; unless ``one_line``,
    its ``if`` and ``else`` parts each on a line too (a nested field's
    lookup, written twice, is too long for one)."""

    def line(indent: str) -> cst.ParenthesizedWhitespace:
        return cst.ParenthesizedWhitespace(
            first_line=cst.TrailingWhitespace(), indent=True, last_line=cst.SimpleWhitespace(indent)
        )

    indent = module.default_indent
    value = value.with_changes(
        lpar=[cst.LeftParen(whitespace_after=line(indent))], rpar=[cst.RightParen(whitespace_before=line(""))]
    )
    if one_line:
        return value
    return value.with_changes(whitespace_before_if=line(indent), whitespace_before_else=line(indent))
