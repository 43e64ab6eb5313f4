"""NRN005 router-float32."""

from __future__ import annotations

import re

import libcst as cst

from autoport_cst.lint.diagnostics import WARNING
from autoport_cst.lint.exprs import FLOAT32
from autoport_cst.lint.index import ClassInfo, Site
from autoport_cst.lint.rule import Invalid, Option, Rule, Valid
from autoport_cst.transform.cst.roles import class_role
from autoport_cst.transform.cst.vocabulary import (
    dotted,
    keyword_arg,
    positional_args,
    self_attr,
    string_value,
)

PARAMETER = frozenset({"nn.Parameter", "torch.nn.Parameter", "Parameter"})
ROUTER_ATTR = re.compile(r"router|(^|_)gate_weight$")
MOE_CLASS = re.compile(r"MoE|Moe|Expert|Router|Sparse")


class RouterFloat32(Rule):
    """An MoE router (gate) weight created in a dtype other than float32:
    ``self.router_weight = nn.Parameter(torch.empty(E, H, dtype=config.torch_dtype))``,
    or a router ``nn.Linear`` / parallel linear with such a ``dtype=``.

    Why: the router's softmax over experts is precision-sensitive. A bf16
    router weight changes which experts win for near-tied tokens, and the port
    drifts from the reference (wrong experts chosen, accuracy far off) without
    any error. The porting checklist asks for float32 router weights, loaded
    as float32.

    A router is an attribute whose name contains ``router``, or is
    ``gate_weight`` / ``*_gate_weight``, or is ``gate`` in an MoE class
    (``*MoE*``, ``*Expert*``, ``*Router*``, ``*Sparse*``); projection weights
    (``gate_proj``, ``gate_up_proj``) are not routers. A weight without
    ``dtype=`` gets torch's default (float32) and is not reported.

    Where the real code departs: gpt_oss and qwen3_moe keep a bf16 router and
    compute the routing in float32 (``NF.router(..., computation_dtype=torch.float32)``).
    A bf16 router in a class that routes that way is reported as a warning;
    list it in the option ``allow`` (``"Class.attr"`` or ``"attr"``) to accept
    it.

    Fix: the ``float32-router`` codemod. It changes numerics, so it is unsafe
    and runs only with ``--unsafe-fixes``.

    Example::

        self.router_weight = nn.Parameter(torch.empty(E, H, dtype=self.dtype))           # NRN005
        self.router_weight = nn.Parameter(torch.empty(E, H, dtype=torch.float32))        # fine
    """

    CODE = "NRN005"
    NAME = "router-float32"
    MESSAGE = "MoE router weight is not float32"
    FIX = "float32-router"
    FIX_SAFE = False
    OPTIONS = {
        "allow": Option(
            "list[str]",
            [],
            'Router weights accepted in another dtype, as "Class.attr" or "attr" '
            "(for bf16 routers with float32 routing, as in gpt_oss).",
        ),
    }

    VALID = (
        Valid(
            """
            class Qwen3MoeExperts(nn.Module):
                def __init__(self, config):
                    super().__init__()
                    self.router_weight = nn.Parameter(torch.empty(config.E, config.H, dtype=torch.float32))
                    self.gate_up_proj_weight = nn.Parameter(torch.empty(config.E, config.H, 2, dtype=config.dtype))
                    self.gate_proj_weight = nn.Parameter(torch.empty(config.H, config.I, dtype=config.dtype))
                    self.gate = nn.Linear(config.H, config.E, bias=False)
            """,
            title="float32 router, projections, default dtype",
        ),
        Valid(
            """
            class MLP(nn.Module):
                def __init__(self, config):
                    self.gate = nn.Linear(config.H, config.I, dtype=config.dtype)
            """,
            title="`gate` outside an MoE class is not a router",
        ),
        Valid(
            """
            class GptOssExperts(nn.Module):
                def __init__(self, config):
                    self.router_weight = nn.Parameter(torch.empty(8, 64, dtype=config.torch_dtype))
            """,
            options={"allow": ["GptOssExperts.router_weight"]},
            title="allow-listed",
        ),
    )
    INVALID = (
        Invalid(
            """
            class MixtralSparseMoeBlock(nn.Module):
                def __init__(self, config):
                    super().__init__()
                    self.router_weight = nn.Parameter(torch.empty(config.E, config.H, dtype=config.torch_dtype))
                    self.gate = ColumnParallelLinear(config.H, config.E, dtype=torch.bfloat16)
            """,
            at=((4, 81), (5, 68)),
            fixable=True,
            message="float32",
        ),
        Invalid(
            """
            class GptOssExperts(nn.Module):
                def __init__(self, config):
                    self.router_weight = nn.Parameter(torch.empty(8, 64, dtype=config.torch_dtype))

                def forward(self, x):
                    return NF.router(x, router_weights=self.router_weight.T, top_k=2,
                                     computation_dtype=torch.float32)
            """,
            at=((3, 68),),
            severity=WARNING,
            message="routing is computed in float32",
            title="bf16 router with float32 routing: a warning",
        ),
    )

    def __init__(self, ctx, options=None) -> None:
        super().__init__(ctx, options)
        self.pending: list[tuple[str, cst.BaseExpression, str, Site]] = []
        self.fp32_routing: set[int] = set()

    def _assignment(self, target: cst.BaseExpression, value: cst.BaseExpression | None) -> None:
        attr = self_attr(target)
        if attr is None or value is None or not isinstance(value, cst.Call):
            return
        fn = self.ctx.function
        cls = fn.method_class if fn is not None else None
        if cls is None or not _router_name(attr, cls):
            return
        dtype = _dtype_argument(value)
        if dtype is None:
            return
        text = dotted(dtype) or string_value(dtype) or ""
        if text in FLOAT32 or text in ("float32", "torch.float32"):
            return
        self.pending.append((attr, dtype, text, self.ctx.site()))

    def visit_Assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            self._assignment(target.target, node.value)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        self._assignment(node.target, node.value)

    def visit_Call(self, node: cst.Call) -> None:
        name = dotted(node.func) or ""
        if name.rsplit(".", 1)[-1] != "router":
            return
        arg = keyword_arg(node, "computation_dtype")
        fn = self.ctx.function
        cls = fn.method_class if fn is not None else None
        if arg is not None and cls is not None and (dotted(arg.value) or "") in FLOAT32:
            self.fp32_routing.add(id(cls))

    def finish(self) -> None:
        allowed = set(self.options["allow"])
        for attr, dtype, text, site in self.pending:
            cls = site.function.method_class if site.function else None
            if cls is None or attr in allowed or f"{cls.name}.{attr}" in allowed:
                continue
            shown = text or self.ctx.module.code_for_node(dtype)
            if id(cls) in self.fp32_routing:
                self.report(
                    dtype,
                    f"router weight `self.{attr}` is {shown}, not float32; the routing is "
                    "computed in float32 (as in gpt_oss/qwen3_moe), so this is accepted with "
                    "a warning (list it in the NRN005 option `allow` to silence it)",
                    site=site,
                    severity=WARNING,
                )
            else:
                self.report(
                    dtype,
                    f"router weight `self.{attr}` is {shown}, not float32: a bf16 router "
                    "changes which experts win for near-tied tokens (create and load it as "
                    "torch.float32)",
                    site=site,
                )


def _router_name(attr: str, cls: ClassInfo) -> bool:
    lowered = attr.lower()
    if "proj" in lowered or "bias" in lowered or "gate_up" in lowered:
        return False
    if ROUTER_ATTR.search(lowered):
        return True
    if lowered == "gate":
        return bool(MOE_CLASS.search(cls.name)) or class_role(cls.name) in ("moe", "experts", "router")
    return False


def _dtype_argument(call: cst.Call) -> cst.BaseExpression | None:
    """The ``dtype=`` of a parameter's allocation or of a linear layer."""
    name = dotted(call.func) or ""
    if name in PARAMETER:
        args = positional_args(call)
        data = args[0].value if args else None
        if data is None:
            arg = keyword_arg(call, "data")
            data = arg.value if arg is not None else None
        while isinstance(data, cst.Call):
            arg = keyword_arg(data, "dtype")
            if arg is not None:
                return arg.value
            func = data.func
            if isinstance(func, cst.Attribute) and func.attr.value in ("to", "float", "bfloat16", "half"):
                if func.attr.value == "to":
                    inner = positional_args(data)
                    if inner:
                        return inner[0].value
                elif func.attr.value != "float":
                    return func.attr
                else:
                    return None
                data = func.value
                continue
            return None
        return None
    if name.endswith("Linear"):
        arg = keyword_arg(call, "dtype")
        return arg.value if arg is not None else None
    return None
