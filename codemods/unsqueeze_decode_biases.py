"""unsqueeze-decode-biases: biases passed to ``NF.attention_decode`` become ``[1, N]``."""

from __future__ import annotations

import libcst as cst

from autoport_cst.transform import Codemod, Example, FileContext
from autoport_cst.transform.anatomy.qkv import projection_kind
from autoport_cst.transform.cst.roles import class_role
from autoport_cst.transform.cst.snippets import parse_expr
from autoport_cst.transform.cst.vocabulary import (
    classes_with_role,
    code_of,
    dotted,
    is_none,
    nodes_of,
    positional_args,
    self_assignment,
    self_attr,
    walk,
)
from autoport_cst.transform.edit.tree import rewrite

BIAS_ARGUMENTS = ("bias_qkv", "bias_out")
TWO_D_FORMS = ("unsqueeze", "view", "reshape")


class UnsqueezeDecodeBiases(Codemod):
    """Make the biases passed to the decode megakernel 2-D.

    ``NF.attention_decode`` takes ``bias_qkv`` and ``bias_out`` as ``[1, N]``.
    A 1-D bias passes the CPU simulator but fails on Trainium ("Bias shape must
    be [1, I], got (N,)"). Each such argument becomes ``<bias>.unsqueeze(0)``;
    the ``x if x is not None else None`` form keeps its guard
    (``x.unsqueeze(0) if x is not None else None``).

    Every decode kernel call of the file is fixed (``NF.attention_decode`` or
    its op-by-op substitute). Left as they are: ``None``; values already made
    2-D with ``.unsqueeze``, ``.view`` or ``.reshape`` (a local is judged by
    the value it was last bound to before the call); and ``self.<attr>``
    parameters created 2-D in the same class (``torch.zeros(1, n)``).

    Precondition: the file calls the decode kernel, unless the package's
    attention is defined in another file.
    """

    ID = "unsqueeze-decode-biases"
    PURPOSE = "hardware rule"
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
            title="biases passed through locals, to the kernel or its op-by-op substitute",
            before="""
                class GptOssAttention(nn.Module):
                    def forward_decode(self, x):
                        qkv_bias = self.qkv_proj_bias.unsqueeze(0) if self.qkv_proj_bias is not None else None
                        out_bias = self.o_proj_bias
                        return _attention_decode_unfused(X=x, bias_qkv=qkv_bias, bias_out=out_bias)
            """,
            after="""
                class GptOssAttention(nn.Module):
                    def forward_decode(self, x):
                        qkv_bias = self.qkv_proj_bias.unsqueeze(0) if self.qkv_proj_bias is not None else None
                        out_bias = self.o_proj_bias
                        return _attention_decode_unfused(X=x, bias_qkv=qkv_bias, bias_out=out_bias.unsqueeze(0))
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
        calls = [n for n in nodes_of(module, cst.Call) if projection_kind(n) == "decode"]
        if not calls:
            if any(class_role(name) == "attention" for name in ctx.port.package_classes) and not any(
                c.name.value for c in classes_with_role(module, "attention")
            ):
                return module  # the attention (and its decode kernel) is in another file of the package
            raise ctx.precondition("unsqueeze-decode-biases: no NF.attention_decode(...) call in this file")
        fixer = _Unsqueeze(_two_d_parameters(nodes_of(module, cst.SimpleStatementLine)), module)
        edits = {}
        for func in nodes_of(module, cst.FunctionDef):
            for call in (n for n in nodes_of(func, cst.Call) if projection_kind(n) == "decode"):
                if id(call) not in edits:
                    edits[id(call)] = lambda updated, func=func, call=call: fixer.edit(
                        updated, _locals(func, call)
                    )
        return rewrite(module, edits)


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


def is_two_d(value: cst.BaseExpression, two_d_params: set[str], local: dict | None = None) -> bool:
    """Whether a bias argument is None or already 2-D (a local is judged by
    the value ``local`` says it was bound to)."""
    if is_none(value):
        return True
    if isinstance(value, cst.IfExp):
        return is_two_d(value.body, two_d_params, local) and is_two_d(value.orelse, two_d_params, local)
    if isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute):
        if value.func.attr.value in TWO_D_FORMS:
            return True
    if isinstance(value, cst.Name) and local is not None and value.value in local:
        return is_two_d(local[value.value], two_d_params)
    attr = self_attr(value)
    return attr is not None and attr in two_d_params


def _locals(func: cst.FunctionDef, call: cst.Call) -> dict[str, cst.BaseExpression]:
    """The value each local of ``func`` was last bound to (by a plain
    assignment) before the statement holding ``call``."""
    from autoport_cst.transform.anatomy.loaders import bound_names, placed_statements, plain_binding

    values: dict[str, cst.BaseExpression] = {}
    for placed in placed_statements(func):
        if any(n is call for n in walk(placed.stmt)) and isinstance(placed.stmt, cst.SimpleStatementLine):
            break
        for name in bound_names(placed.stmt):
            value = plain_binding(placed.stmt, name)
            if value is None:
                values.pop(name, None)
            else:
                values[name] = value
    return values


class _Unsqueeze:
    def __init__(self, two_d: set[str], module: cst.Module) -> None:
        self.two_d = two_d
        self.module = module

    def _fix(self, value: cst.BaseExpression, local: dict) -> cst.BaseExpression:
        if is_two_d(value, self.two_d, local):
            return value
        if isinstance(value, cst.IfExp):
            return value.with_changes(
                body=self._fix(value.body, local), orelse=self._fix(value.orelse, local)
            )
        code = code_of(value)
        if _needs_parens(value):
            code = f"({code})"
        return parse_expr(f"{code}.unsqueeze(0)", self.module)

    def edit(self, updated: cst.Call, local: dict) -> cst.Call:
        args = list(updated.args)
        for index, arg in enumerate(args):
            if arg.keyword is not None and arg.keyword.value in BIAS_ARGUMENTS:
                args[index] = arg.with_changes(value=self._fix(arg.value, local))
        return updated.with_changes(args=args)


def _needs_parens(value: cst.BaseExpression) -> bool:
    return not isinstance(value, (cst.Name, cst.Attribute, cst.Call, cst.Subscript))


__all__ = ["UnsqueezeDecodeBiases", "is_two_d"]
