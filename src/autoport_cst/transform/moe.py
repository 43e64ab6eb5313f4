"""Shared helpers of the mixture-of-experts codemods (not a codemod: the
library skips modules whose name starts with ``_``).

They find the parts of an experts class in the vllm_neuron style (see
``reference_models/qwen3_moe``): the class by its role (``<Prefix>Experts``),
its router weight parameter, the ``NF.router`` call of its routing method and
the statement that turns router logits into scores, the fused decode kernel
call ``NF.moe_block_tkg``, and the ``load_weights`` mapping of the router.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from autoport_cst.transform.cst_helpers import (
    classes_with_role,
    code_of,
    dotted,
    insert_many_after,
    is_call,
    keyword_arg,
    positional_args,
    replace_string_suffix,
    self_assignment,
    simple_assign,
    walk,
)
from autoport_cst.transform.mappings import entry_statement, mapping_entries

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
            if assign is not None and is_call(assign[1], ROUTER_CALL) and found.router_call is None:
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
        routers = found.calls.get(ROUTER_CALL) or found.calls.get("router") or []
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
    """Surveys of the ``<Prefix>Experts`` classes that call ``NF.router``."""
    return [s for s in map(survey, classes_with_role(module, "experts")) if s.router_call is not None]


def calls_named(found: ExpertsSurvey, name: str) -> list[cst.Call]:
    short = name.rsplit(".", 1)[-1]
    return found.calls.get(name, []) + (found.calls.get(short, []) if short != name else [])


def keyword(name: str, value: cst.BaseExpression) -> cst.Arg:
    return cst.Arg(
        keyword=cst.Name(name),
        value=value,
        equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")),
    )


def set_keyword(call: cst.Call, name: str, value: cst.BaseExpression) -> cst.Call:
    """``name=value`` in ``call``: replaced when present, appended otherwise
    (after the last argument, keeping the call's comma style)."""
    arg = keyword_arg(call, name)
    if arg is not None:
        return call.with_changes(args=[a.with_changes(value=value) if a is arg else a for a in call.args])
    args = list(call.args)
    if not args:
        return call.with_changes(args=[keyword(name, value)])
    last = args[-1]
    multiline = isinstance(last.comma, cst.Comma) and isinstance(
        last.comma.whitespace_after, cst.ParenthesizedWhitespace
    )
    if multiline:
        # a trailing comma after the last argument, one argument per line
        new = keyword(name, value).with_changes(comma=last.comma)
        previous = [a for a in args[:-1] if isinstance(a.comma, cst.Comma)]
        separator = previous[-1].comma if previous else last.comma
        args[-1] = last.with_changes(comma=separator)
        return call.with_changes(args=[*args, new])
    if last.comma is cst.MaybeSentinel.DEFAULT:
        args[-1] = last.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
    return call.with_changes(args=[*args, keyword(name, value)])


def remove_keyword(call: cst.Call, name: str) -> cst.Call:
    arg = keyword_arg(call, name)
    if arg is None:
        return call
    args = [a for a in call.args if a is not arg]
    if args and call.args[-1] is arg:
        args[-1] = args[-1].with_changes(comma=arg.comma)
    return call.with_changes(args=args)


def statement_calls(stmt: cst.CSTNode, name: str) -> list[cst.Call]:
    return [n for n in walk(stmt) if isinstance(n, cst.Call) and is_call(n, name)]


def method_parameter(func: cst.FunctionDef, index: int) -> str | None:
    """Name of the ``index``-th parameter after ``self``."""
    params = [p for p in func.params.params if p.name.value != "self"]
    return params[index].name.value if len(params) > index else None


def expert_count(statement: cst.SimpleStatementLine) -> str:
    _, value = self_assignment(statement)
    inner = value.args[0].value if isinstance(value, cst.Call) and value.args else None
    dims = positional_args(inner) if isinstance(inner, cst.Call) else []
    return code_of(dims[0].value) if dims else "self.num_experts"


def add_router_mapping(module, router_params, attr, suffix, codemod_id, ctx, after=()):
    """Add ``mappings[...<attr>]`` next to each router-weight entry (after an
    entry of one of ``after`` when present), its checkpoint key the router's
    with ``.weight`` replaced by ``suffix``."""
    entries = mapping_entries(module)
    keys = {e.key for e in entries}
    router_entries = [e for e in entries if any(e.key.endswith(f".{p}") for p in router_params)]
    if not router_entries:
        wanted = " / ".join(sorted(router_params))
        raise ctx.precondition(f"{codemod_id}: load_weights has no mappings[...{wanted}] entry")
    additions: dict[int, list] = {}
    for entry in router_entries:
        param = next(p for p in router_params if entry.key.endswith(f".{p}"))
        base = entry.key[: -len(param)]
        if base + attr in keys:
            continue
        key = replace_string_suffix(entry.key_node, param, attr)
        value = replace_string_suffix(entry.value, ".weight", suffix)
        if key is None or value is None:
            raise ctx.precondition(
                f"{codemod_id}: cannot derive the checkpoint key from the mapping of {entry.key} "
                "(expected a key ending in .weight)",
                entry.statement,
                module,
            )
        anchor = next((e for e in entries if any(e.key == base + a for a in after)), entry)
        additions.setdefault(id(anchor.statement), []).append(entry_statement(entry, key, value))
    return insert_many_after(module, additions)
