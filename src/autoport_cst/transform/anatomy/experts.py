"""The experts classes of a model file (``<Prefix>Experts``) surveyed, and
the router and MoE-kernel sites on every path, with the settings they pass."""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from autoport_cst.transform.cst.vocabulary import (
    classes_with_role,
    code_of,
    dotted,
    is_call,
    positional_args,
    self_assignment,
    simple_assign,
    walk,
)

ROUTER_CALL = "NF.router"


DECODE_KERNEL = "NF.moe_block_tkg"


BLOCKWISE_KERNEL = "NF.moe_cte"


SCORE_FUNCTIONS = ("torch.softmax", "torch.sigmoid", "F.softmax", "F.sigmoid", "torch.nn.functional.softmax")


@dataclass
class ExpertsSurvey:
    """One walk over an experts class."""

    cls: cst.ClassDef
    params: dict[str, cst.SimpleStatementLine] = field(default_factory=dict)  # self.<x> = nn.Parameter(...)
    assigned: dict[str, cst.SimpleStatementLine] = field(default_factory=dict)  # any self.<x> = ...
    methods: dict[str, cst.FunctionDef] = field(default_factory=dict)
    calls: dict[str, list[cst.Call]] = field(default_factory=dict)
    router_statement: cst.SimpleStatementLine | None = None
    router_call: cst.Call | None = None
    router_targets: tuple[str, ...] = ()  # names the NF.router result is assigned to
    score_statements: list[cst.SimpleStatementLine] = field(default_factory=list)

    @property
    def router_param(self) -> str | None:
        for name in ("router_weight", "gate_weight"):
            if name in self.params:
                return name
        return None


def survey(cls: cst.ClassDef) -> ExpertsSurvey:
    found = ExpertsSurvey(cls)
    for stmt in cls.body.body:
        if isinstance(stmt, cst.FunctionDef):
            found.methods[stmt.name.value] = stmt
    for node in walk(cls):
        if isinstance(node, cst.SimpleStatementLine):
            pair = self_assignment(node)
            if pair is not None:
                found.assigned.setdefault(pair[0], node)
                if isinstance(pair[1], cst.Call) and (dotted(pair[1].func) or "").endswith("Parameter"):
                    found.params.setdefault(pair[0], node)
            assign = simple_assign(node)
            if (
                assign is not None
                and isinstance(assign[1], cst.Call)
                and is_call(assign[1], ROUTER_CALL, "_moe_router")
                and found.router_call is None
            ):
                found.router_statement = node
                found.router_call = assign[1]
                target = assign[0]
                if isinstance(target, cst.Tuple):
                    found.router_targets = tuple(
                        e.value.value for e in target.elements if isinstance(e.value, cst.Name)
                    )
                elif isinstance(target, cst.Name):
                    found.router_targets = (target.value,)
        elif isinstance(node, cst.Call):
            name = dotted(node.func)
            if name is not None:
                found.calls.setdefault(name, []).append(node)
    if found.router_call is None:
        routers = (
            found.calls.get(ROUTER_CALL) or found.calls.get("router") or found.calls.get("_moe_router") or []
        )
        found.router_call = routers[0] if routers else None
    if len(found.router_targets) == 2:
        logits = found.router_targets[1]
        for node in walk(cls):
            if not isinstance(node, cst.SimpleStatementLine):
                continue
            assign = simple_assign(node)
            if (
                assign is not None
                and isinstance(assign[1], cst.Call)
                and dotted(assign[1].func) in SCORE_FUNCTIONS
                and assign[1].args
                and isinstance(assign[1].args[0].value, cst.Name)
                and assign[1].args[0].value.value == logits
            ):
                found.score_statements.append(node)
    return found


def experts_classes(module: cst.Module) -> list[ExpertsSurvey]:
    """Surveys of the ``<Prefix>Experts`` classes that call ``NF.router`` (or
    its op-by-op substitute ``_moe_router``)."""
    return [s for s in map(survey, classes_with_role(module, "experts")) if s.router_call is not None]


def calls_named(found: ExpertsSurvey, name: str) -> list[cst.Call]:
    short = name.rsplit(".", 1)[-1]
    return found.calls.get(name, []) + (found.calls.get(short, []) if short != name else [])


def statement_calls(stmt: cst.CSTNode, name: str) -> list[cst.Call]:
    return [n for n in walk(stmt) if isinstance(n, cst.Call) and is_call(n, name)]


def method_parameter(func: cst.FunctionDef, index: int) -> str | None:
    """Name of the ``index``-th parameter after ``self``."""
    params = [p for p in func.params.params if p.name.value != "self"]
    return params[index].name.value if len(params) > index else None


def expert_count(statement: cst.SimpleStatementLine) -> str:
    pair = self_assignment(statement)
    assert pair is not None, "the experts' weight assignment"
    value = pair[1]
    inner = value.args[0].value if isinstance(value, cst.Call) and value.args else None
    dims = positional_args(inner) if isinstance(inner, cst.Call) else []
    return code_of(dims[0].value) if dims else "self.num_experts"


# -- router and MoE-kernel sites on every path (the real packages' shapes) -------------
#
# The real packages route in the prefill with ``x = NF.router(...)`` (no
# logits taken back) and in decode inside ``NF.moe_block_tkg`` (norm, router,
# top-k and experts in one call); our references take the logits back in a
# routing method and compute the scores themselves. The codemods edit each
# site by its kind, substitute an op-by-op function where the kernel cannot
# express a feature, and guard the sites nothing can express.

ROUTER_SUBSTITUTE = "_moe_router"


BLOCK_SUBSTITUTE = "_moe_block_tkg_unfused"


TOPK_FUNCTION_NAME = "_moe_topk_affinities"


@dataclass(frozen=True)
class MoESite:
    """One call of a family (its path variants merged)."""

    call: cst.Call
    cls: str
    function: str
    kind: str  # "router", "router_sub", "block", "block_sub", "cte", "other"
    name: str  # the callee as written


def site_kind(name: str) -> str:
    last = name.rsplit(".", 1)[-1]
    if last == ROUTER_SUBSTITUTE:
        return "router_sub"
    if last == BLOCK_SUBSTITUTE:
        return "block_sub"
    if last == "router":
        return "router"
    if last == "moe_block_tkg":
        return "block"
    if last == "moe_cte":
        return "cte"
    return "other"


def moe_sites(module: cst.Module, family: str) -> list[MoESite]:
    """Every call of ``family`` (``moe.router`` or ``moe.experts``) in the
    forward methods of ``module``'s classes, once per call."""
    from autoport_cst.transform.anatomy.sites import find_sites

    seen: set[int] = set()
    found: list[MoESite] = []
    for site in find_sites(module, family):
        if id(site.node) in seen:
            continue
        seen.add(id(site.node))
        assert isinstance(site.node, cst.Call)  # the MoE families are kernel calls
        found.append(MoESite(site.node, site.cls, site.function, site_kind(site.kind), site.kind))
    return found


def class_named(module: cst.Module, name: str) -> cst.ClassDef | None:
    return next((s for s in module.body if isinstance(s, cst.ClassDef) and s.name.value == name), None)


def method_of(module: cst.Module, site: MoESite) -> cst.FunctionDef | None:
    cls = class_named(module, site.cls)
    if cls is None:
        return None
    return next(
        (s for s in cls.body.body if isinstance(s, cst.FunctionDef) and s.name.value == site.function), None
    )


def literal(call: cst.Call, name: str) -> str | None:
    """The source of ``name=``'s value, or None when absent."""
    from autoport_cst.transform.cst.vocabulary import keyword_arg

    arg = keyword_arg(call, name)
    return None if arg is None else code_of(arg.value)


def _bool(text: str | None, default: bool | None) -> bool | None:
    if text is None:
        return default
    return {"True": True, "False": False}.get(text)


def activation_of(site: MoESite) -> str | None:
    """``softmax`` or ``sigmoid``: the router activation of a site."""
    if site.kind in ("router", "router_sub"):
        text = literal(site.call, "activation")
        return "softmax" if text is None else text.strip("\"'")
    text = literal(site.call, "router_act_fn") or ""
    for name in ("softmax", "sigmoid"):
        if text.lower().endswith(name):
            return name
    return None


def renormalizes(site: MoESite) -> bool | None:
    """Whether the site renormalizes the chosen experts' weights to sum to one:
    a constant, or None when it is read at run time (``self.norm_topk_prob``),
    the site post-processes its logits itself, or the kernel is not known."""
    call = site.call
    if site.kind == "router":
        if (
            literal(call, "return_logits") is not None
            or literal(call, "router_computation_order") is not None
        ):
            return None
        return activation_of(site) == "softmax"
    if site.kind == "router_sub":
        return _bool(literal(call, "norm_topk_prob"), True)
    if site.kind in ("block", "block_sub"):
        norm = literal(call, "norm_topk_prob")
        pre_norm = _bool(literal(call, "router_pre_norm"), True)
        if norm == "True" or (pre_norm is False and activation_of(site) == "softmax"):
            return True
        if norm is not None and norm != "False" or pre_norm is None:
            return None
        return False
    return None
