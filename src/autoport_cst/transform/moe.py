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


# -- config aliases ------------------------------------------------------------------

ALIASES_NAME = "_ALIASES"


def add_config_alias(module: cst.Module, ctx, codemod_id: str, name: str, keys: tuple[str, ...]) -> cst.Module:
    """Add ``"name": (keys...)`` to the config file's ``_ALIASES`` dict (field
    -> the config keys that may hold it, first present wins), unless the dict
    has an entry for ``name`` already. Entries are kept sorted by field name,
    so that codemods adding aliases give the same file in any order."""
    for stmt in module.body:
        if not isinstance(stmt, cst.SimpleStatementLine):
            continue
        pair = simple_assign(stmt)
        if pair is None or not isinstance(pair[0], cst.Name) or pair[0].value != ALIASES_NAME:
            continue
        table = pair[1]
        if not isinstance(table, cst.Dict):
            break
        if any(isinstance(e, cst.DictElement) and string_text_of(e.key) == name for e in table.elements):
            return module
        from autoport_cst.transform.cst_helpers import parse_expr

        keys_code = "(" + ", ".join(f'"{k}"' for k in keys) + ("," if len(keys) == 1 else "") + ")"
        element = cst.DictElement(parse_expr(f'"{name}"', module), parse_expr(keys_code, module))
        elements = list(table.elements)
        keys = [string_text_of(e.key) if isinstance(e, cst.DictElement) else None for e in elements]
        index = next((i for i, k in enumerate(keys) if k is not None and k > name), len(elements))
        if index < len(elements):
            # sorted position, so that codemods adding aliases commute
            model = elements[index - 1] if index > 0 else elements[index]
            element = element.with_changes(comma=model.comma)
        elif elements:
            last = elements[-1]
            if len(elements) > 1 and isinstance(elements[-2].comma, cst.Comma):
                separator = elements[-2].comma  # one entry per line: keep the layout
            elif isinstance(table.lbrace.whitespace_after, cst.ParenthesizedWhitespace):
                separator = cst.Comma(whitespace_after=table.lbrace.whitespace_after)
            else:
                separator = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
            element = element.with_changes(comma=last.comma)
            elements[-1] = last.with_changes(comma=separator)
        elements.insert(index, element)
        new_table = table.with_changes(elements=elements)
        return rewrite_node(module, table, new_table)
    raise ctx.precondition(
        f"{codemod_id}: the config file has no {ALIASES_NAME} dict (field -> config keys that may hold it)"
    )


def string_text_of(node: cst.CSTNode) -> str | None:
    from autoport_cst.transform.cst_helpers import string_text

    return string_text(node)


def rewrite_node(root: cst.CSTNode, old: cst.CSTNode, new: cst.CSTNode) -> cst.CSTNode:
    from autoport_cst.transform.cst_helpers import rewrite

    return rewrite(root, {id(old): lambda updated, new=new: new})


# -- checkpoint keys of the router and its MoE block ----------------------------------


def router_key_parts(value: cst.BaseExpression) -> tuple[str, str] | None:
    """From a router weight's mapping value, the source of the router
    module's checkpoint key and of its MoE block's:
    ``f"{moe.router}.weight"`` -> (``moe.router``, ``moe.module``);
    ``f"{prefix}.mlp.gate.weight"`` -> (``f"{prefix}.mlp.gate"``, ``f"{prefix}.mlp"``)."""
    from autoport_cst.transform.cst_helpers import string_text

    if isinstance(value, cst.FormattedString) and len(value.parts) == 2:
        head, tail = value.parts
        if (
            isinstance(head, cst.FormattedStringExpression)
            and isinstance(head.expression, cst.Attribute)
            and head.expression.attr.value == "router"
            and isinstance(tail, cst.FormattedStringText)
            and tail.value == ".weight"
        ):
            owner = code_of(head.expression.value)
            return f"{owner}.router", f"{owner}.module"
    text = string_text(value)
    if text is None or not text.endswith(".weight"):
        return None
    prefix = "f" if isinstance(value, cst.FormattedString) else ""
    router = text[: -len(".weight")]
    if "." not in router:
        return None
    return f'{prefix}"{router}"', f'{prefix}"{router.rsplit(".", 1)[0]}"'


def add_router_mapping_value(module, router_params, attr, make_value, codemod_id, ctx, after=()):
    """Like :func:`add_router_mapping`, the value built by ``make_value(router,
    block)`` from the sources of the router's and the MoE block's keys."""
    from autoport_cst.transform.cst_helpers import parse_expr

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
        parts = router_key_parts(entry.value)
        if key is None or parts is None:
            raise ctx.precondition(
                f"{codemod_id}: cannot derive the router's checkpoint key from the mapping of {entry.key} "
                '(expected f"{moe.router}.weight" or a key ending in .<router>.weight)',
                entry.statement,
                module,
            )
        value = parse_expr(make_value(*parts), module)
        anchor = next((e for e in entries if any(e.key == base + a for a in after)), entry)
        additions.setdefault(id(anchor.statement), []).append(entry_statement(entry, key, value))
    return insert_many_after(module, additions)
