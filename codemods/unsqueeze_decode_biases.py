"""unsqueeze-decode-biases: biases passed to ``NF.attention_decode`` become ``[1, N]``."""

from __future__ import annotations

import libcst as cst

from autoport_cst.transform import Codemod, Example, FileContext
from autoport_cst.transform.cst_helpers import (
    code_of,
    dotted,
    is_call,
    is_none,
    parse_expr,
    positional_args,
    rewrite,
    self_assignment,
    self_attr,
    walk,
)

BIAS_ARGUMENTS = ("bias_qkv", "bias_out")
TWO_D_FORMS = ("unsqueeze", "view", "reshape")


class UnsqueezeDecodeBiases(Codemod):
    """Make the biases passed to the decode megakernel 2-D.

    ``NF.attention_decode`` takes ``bias_qkv`` and ``bias_out`` as ``[1, N]``.
    A 1-D bias passes the CPU simulator but fails on Trainium ("Bias shape must
    be [1, I], got (N,)"). Each such argument becomes ``<bias>.unsqueeze(0)``;
    the ``x if x is not None else None`` form keeps its guard
    (``x.unsqueeze(0) if x is not None else None``).

    Left as they are: ``None``; values already made 2-D with ``.unsqueeze``,
    ``.view`` or ``.reshape``; and ``self.<attr>`` parameters created 2-D in
    the same class (``torch.zeros(1, n)``).

    Precondition: the file calls ``NF.attention_decode``.
    """

    ID = "unsqueeze-decode-biases"
    EXAMPLES = (
        Example(
            title="1-D bias parameters",
            before="""
                class GptOssAttention(nn.Module):
                    def __init__(self, config):
                        self.qkv_proj_bias = nn.Parameter(torch.zeros(qkv_size, dtype=self.dtype))
                        self.o_proj_bias = nn.Parameter(torch.zeros(1, self.hidden_size, dtype=self.dtype))

                    def forward_decode(self, x):
                        return NF.attention_decode(
                            X=x,
                            bias_qkv=self.qkv_proj_bias if self.qkv_proj_bias is not None else None,
                            bias_out=self.o_proj_bias,
                        )
            """,
            after="""
                class GptOssAttention(nn.Module):
                    def __init__(self, config):
                        self.qkv_proj_bias = nn.Parameter(torch.zeros(qkv_size, dtype=self.dtype))
                        self.o_proj_bias = nn.Parameter(torch.zeros(1, self.hidden_size, dtype=self.dtype))

                    def forward_decode(self, x):
                        return NF.attention_decode(
                            X=x,
                            bias_qkv=self.qkv_proj_bias.unsqueeze(0) if self.qkv_proj_bias is not None else None,
                            bias_out=self.o_proj_bias,
                        )
            """,
        ),
        Example(
            title="no decode kernel call",
            before="""
                def forward(x):
                    return NF.mlp(x)
            """,
            raises="no NF.attention_decode",
        ),
    )

    def transform_module(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        nodes = walk(module)
        calls = [n for n in nodes if is_call(n, "NF.attention_decode")]
        if not calls:
            raise ctx.precondition(
                "unsqueeze-decode-biases: no NF.attention_decode(...) call in this file"
            )
        fixer = _Unsqueeze(_two_d_parameters(nodes), module)
        return rewrite(module, {id(call): fixer.edit for call in calls})


def _two_d_parameters(nodes: list[cst.CSTNode]) -> set[str]:
    """Attributes created as 2-D parameters: ``self.x = nn.Parameter(torch.zeros(a, b, ...))``."""
    found = set()
    for node in nodes:
        if not isinstance(node, cst.SimpleStatementLine):
            continue
        assignment = self_assignment(node)
        if assignment is None:
            continue
        attr, value = assignment
        if isinstance(value, cst.Call) and (dotted(value.func) or "").endswith("Parameter") and value.args:
            inner = value.args[0].value
            if isinstance(inner, cst.Call) and len(positional_args(inner)) == 2:
                found.add(attr)
    return found


def is_two_d(value: cst.BaseExpression, two_d_params: set[str]) -> bool:
    """Whether a bias argument is None or already 2-D."""
    if is_none(value):
        return True
    if isinstance(value, cst.IfExp):
        return is_two_d(value.body, two_d_params) and is_two_d(value.orelse, two_d_params)
    if isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute):
        if value.func.attr.value in TWO_D_FORMS:
            return True
    attr = self_attr(value)
    return attr is not None and attr in two_d_params


class _Unsqueeze:
    def __init__(self, two_d: set[str], module: cst.Module) -> None:
        self.two_d = two_d
        self.module = module

    def _fix(self, value: cst.BaseExpression) -> cst.BaseExpression:
        if is_two_d(value, self.two_d):
            return value
        if isinstance(value, cst.IfExp):
            return value.with_changes(body=self._fix(value.body), orelse=self._fix(value.orelse))
        code = code_of(value)
        if _needs_parens(value):
            code = f"({code})"
        return parse_expr(f"{code}.unsqueeze(0)", self.module)

    def edit(self, updated: cst.Call) -> cst.Call:
        args = list(updated.args)
        for index, arg in enumerate(args):
            if arg.keyword is not None and arg.keyword.value in BIAS_ARGUMENTS:
                args[index] = arg.with_changes(value=self._fix(arg.value))
        return updated.with_changes(args=args)


def _needs_parens(value: cst.BaseExpression) -> bool:
    return not isinstance(value, (cst.Name, cst.Attribute, cst.Call, cst.Subscript))


__all__ = ["UnsqueezeDecodeBiases", "is_two_d"]
