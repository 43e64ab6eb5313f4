"""NRN004 decode-bias-2d."""

from __future__ import annotations

import libcst as cst

from autoport_cst.lint.index import ClassInfo, FunctionInfo, Site
from autoport_cst.lint.rule import Invalid, Rule, Valid
from autoport_cst.transform.cst.vocabulary import dotted, int_value, keyword_arg, positional_args, receiver

BIASES = ("bias_qkv", "bias_out")
PARAMETER = frozenset({"nn.Parameter", "torch.nn.Parameter", "Parameter"})
FACTORIES = frozenset({"empty", "zeros", "ones", "full", "rand", "randn", "Tensor"})
SAME_SHAPE = frozenset(
    {
        "to",
        "float",
        "half",
        "bfloat16",
        "contiguous",
        "clone",
        "detach",
        "type_as",
        "mul",
        "div",
        "add",
        "sub",
    }
)
FLATTENING = frozenset({"flatten", "ravel", "squeeze"})

_NONE = -1  # the value None


class DecodeBias2d(Rule):
    """A 1-D bias passed to ``NF.attention_decode`` as ``bias_qkv`` or
    ``bias_out``.

    Why: the fused decode kernel takes biases shaped ``[1, size]``. A 1-D
    ``[size]`` tensor passes the CPU simulator but fails on Trainium with
    "Bias shape must be [1, I], got (N,)". Pass ``bias.unsqueeze(0)`` (or
    ``.view(1, -1)`` / ``.reshape(1, -1)``), or declare the parameter 2-D.

    The bias's shape is read from the expression: ``None`` and
    ``x.unsqueeze(0)`` / ``x.view(1, -1)`` / ``x[None]`` are fine, as are both
    branches of ``x.unsqueeze(0) if x is not None else None``; ``self.b`` is
    followed to its ``nn.Parameter(torch.zeros(...))`` in ``__init__`` (the
    number of shape arguments is its rank), a local to its assignments;
    ``.flatten()``, ``.squeeze()`` and ``.view(-1)`` are 1-D. An expression of
    unknown rank is not reported.

    Fix: the ``unsqueeze-decode-biases`` codemod.

    Example::

        self.qkv_proj_bias = nn.Parameter(torch.zeros(qkv_size, dtype=dtype))
        ...
        NF.attention_decode(..., bias_qkv=self.qkv_proj_bias)               # NRN004
        NF.attention_decode(..., bias_qkv=self.qkv_proj_bias.unsqueeze(0))  # fine
    """

    CODE = "NRN004"
    NAME = "decode-bias-2d"
    MESSAGE = "1-D bias passed to NF.attention_decode"
    FIX = "unsqueeze-decode-biases"

    VALID = (
        Valid(
            """
            class Attention(nn.Module):
                def __init__(self, size, dtype):
                    super().__init__()
                    self.qkv_proj_bias = nn.Parameter(torch.zeros(size, dtype=dtype))
                    self.o_proj_bias = nn.Parameter(torch.zeros(1, size, dtype=dtype))

                def forward_decode(self, x):
                    b = self.qkv_proj_bias.view(1, -1)
                    return NF.attention_decode(
                        X=x,
                        bias_qkv=self.qkv_proj_bias.unsqueeze(0) if self.qkv_proj_bias is not None else None,
                        bias_out=self.o_proj_bias,
                    ) + NF.attention_decode(X=x, bias_qkv=b, bias_out=None)
            """,
            title="unsqueezed, declared 2-D, None",
        ),
        Valid(
            """
            class Attention(nn.Module):
                def forward_decode(self, x, bias):
                    return NF.attention_decode(X=x, bias_qkv=bias, bias_out=self.unknown_bias)
            """,
            title="rank unknown: not reported",
        ),
        Valid(
            """
            class Attention(nn.Module):
                def __init__(self, size):
                    self.qkv_proj_bias = nn.Parameter(torch.zeros(size))

                def forward_prefill(self, x):
                    return NF.qkv_proj(hidden=x, qkv_weights=self.w, bias=self.qkv_proj_bias)
            """,
            title="other NF calls are not checked",
        ),
    )
    INVALID = (
        Invalid(
            """
            class Attention(nn.Module):
                def __init__(self, config):
                    super().__init__()
                    qkv_size = config.q_size + 2 * config.kv_size
                    self.qkv_proj_bias = nn.Parameter(torch.zeros(qkv_size, dtype=config.dtype))
                    self.o_proj_bias = nn.Parameter(torch.zeros((config.hidden_size,)))

                def forward_decode(self, x):
                    return NF.attention_decode(
                        X=x,
                        bias_qkv=self.qkv_proj_bias,
                        bias_out=self.o_proj_bias if self.o_proj_bias is not None else None,
                    )
            """,
            at=((11, 22), (12, 22)),
            fixable=True,
        ),
        Invalid(
            """
            class Attention(nn.Module):
                def forward_decode(self, x, w):
                    bias = self.qkv_bias_2d.flatten()
                    out_bias = w.view(-1)
                    return attention_decode(X=x, bias_qkv=bias, bias_out=out_bias)
            """,
            at=((5, 47), (5, 62)),
            title="flattened locals",
        ),
    )

    def __init__(self, ctx, options=None) -> None:
        super().__init__(ctx, options)
        self.pending: list[tuple[str, cst.BaseExpression, Site]] = []

    def visit_Call(self, node: cst.Call) -> None:
        name = dotted(node.func)
        if name is None or not (name == "attention_decode" or name.endswith(".attention_decode")):
            return
        for bias in BIASES:
            arg = keyword_arg(node, bias)
            if arg is not None:
                self.pending.append((bias, arg.value, self.ctx.site()))

    def finish(self) -> None:
        for bias, value, site in self.pending:
            rank, why = self.rank(value, site.function, 0)
            if rank != 1:
                continue
            code = self.ctx.module.code_for_node(value)
            self.report(
                value,
                f"`{bias}={_short(code)}` passed to NF.attention_decode is 1-D{why}; the decode "
                'kernel needs [1, size] and fails on Trainium with "Bias shape must be '
                '[1, I]" (pass `.unsqueeze(0)`)',
                site=site,
            )

    # -- rank of an expression -------------------------------------------------

    def rank(self, node: cst.BaseExpression, fn: FunctionInfo | None, depth: int) -> tuple[int | None, str]:
        """(rank, explanation); rank None when unknown, _NONE for None."""
        if depth > 8:
            return None, ""
        if isinstance(node, cst.Name):
            if node.value == "None":
                return _NONE, ""
            return self._local_rank(node.value, fn, depth)
        if isinstance(node, cst.IfExp):
            ranks = [self.rank(node.body, fn, depth + 1), self.rank(node.orelse, fn, depth + 1)]
            known = [r for r in ranks if r[0] not in (None, _NONE)]
            for r in known:
                if r[0] == 1:
                    return r
            if known and len(known) == len([r for r in ranks if r[0] != _NONE]):
                return known[0]
            return None, ""
        if isinstance(node, cst.Subscript):
            nones = sum(
                1
                for el in node.slice
                if isinstance(el.slice, cst.Index)
                and isinstance(el.slice.value, cst.Name)
                and el.slice.value.value == "None"
            )
            if nones:
                inner, _ = self.rank(node.value, fn, depth + 1)
                return (inner if inner not in (None, _NONE) else 1) + nones, ""
            return None, ""
        if isinstance(node, cst.Attribute):
            attr = node.attr.value
            if isinstance(node.value, cst.Name) and node.value.value == "self" and fn is not None:
                return self._attribute_rank(attr, fn.method_class)
            return None, ""
        if isinstance(node, cst.Call):
            name = dotted(node.func) or ""
            if name.startswith("torch.") and name.rsplit(".", 1)[-1] in FACTORIES:
                return _shape_rank(node), ""
            method = node.func.attr.value if isinstance(node.func, cst.Attribute) else None
            base = receiver(node)
            if method is None or base is None:
                return None, ""
            if method == "unsqueeze":
                inner, _ = self.rank(base, fn, depth + 1)
                return (inner if inner not in (None, _NONE) else 1) + 1, ""
            if method in ("view", "reshape", "expand"):
                args = positional_args(node)
                if any(a.star for a in node.args) or not args:
                    return None, ""
                if len(args) == 1:
                    value = args[0].value
                    if isinstance(value, (cst.Tuple, cst.List)):
                        return len(value.elements), ""
                    return (1, " (viewed as 1-D)") if int_value(value) is not None else (None, "")
                return len(args), ""
            if method in FLATTENING:
                if method == "squeeze" and node.args:
                    return None, ""
                return 1, f" (after .{method}())"
            if method in SAME_SHAPE:
                return self.rank(base, fn, depth + 1)
        return None, ""

    def _local_rank(self, name: str, fn: FunctionInfo | None, depth: int) -> tuple[int | None, str]:
        scope = fn
        while scope is not None:
            values = scope.assigns.get(name)
            if values:
                known = [v for v in values if v is not None]
                if len(known) < len(values):
                    return None, ""
                ranks = [self.rank(v, scope, depth + 1) for v in known]
                for r in ranks:
                    if r[0] == 1:
                        return r
                return ranks[0] if len({r[0] for r in ranks}) == 1 else (None, "")
            if name in scope.params:
                return None, ""
            scope = scope.parent
        return None, ""

    def _attribute_rank(self, attr: str, cls: ClassInfo | None) -> tuple[int | None, str]:
        seen = set()
        while cls is not None and id(cls) not in seen:
            seen.add(id(cls))
            values = cls.attrs.get(attr)
            if values:
                ranks = set()
                for owner, value in values:
                    if isinstance(value, cst.Name) and value.value == "None":
                        continue
                    if isinstance(value, cst.Call) and dotted(value.func) in PARAMETER:
                        inner = positional_args(value)
                        data = inner[0].value if inner else None
                        if data is None and value.args:
                            data = value.args[0].value
                        ranks.add(self.rank(data, owner, 1)[0] if data is not None else None)
                    else:
                        ranks.add(self.rank(value, owner, 1)[0])
                if len(ranks) == 1:
                    rank = ranks.pop()
                    why = f" (`self.{attr}` is created 1-D)" if rank == 1 else ""
                    return rank, why
                return None, ""
            cls = cls.in_file_bases[0] if cls.in_file_bases else None
        return None, ""


def _shape_rank(call: cst.Call) -> int | None:
    size = keyword_arg(call, "size")
    args = positional_args(call)
    if size is not None:
        value = size.value
    elif len(args) == 1:
        value = args[0].value
    elif args and not any(a.star for a in call.args):
        return len(args)
    else:
        return None
    if isinstance(value, (cst.Tuple, cst.List)):
        if any(isinstance(e, cst.StarredElement) for e in value.elements):
            return None
        return len(value.elements)
    if isinstance(value, (cst.Integer, cst.BinaryOperation)):
        return 1
    # a name or attribute holding an int (hidden_size), unless it looks like a shape
    if isinstance(value, cst.Name):
        name = value.value
    elif isinstance(value, cst.Attribute):
        name = value.attr.value
    else:
        return None
    if name in ("shape", "size", "sizes", "dims") or name.endswith(("_shape", "_dims", "_sizes")):
        return None
    return 1


def _short(code: str) -> str:
    code = " ".join(code.split())
    return code if len(code) <= 60 else code[:57] + "..."
