"""Edits of the mixture-of-experts codemods: the router's ``load_weights``
mappings and config aliases, the op-by-op substitutes of ``NF.router`` and
``NF.moe_block_tkg`` for what the kernels cannot take, and the guards of the
sites a codemod cannot change. The experts classes and the router and
MoE-kernel sites they edit are found by ``autoport_cst.transform.anatomy.experts``."""

from __future__ import annotations

import libcst as cst

from autoport_cst.transform.anatomy.experts import (
    BLOCK_SUBSTITUTE,
    BLOCKWISE_KERNEL,
    ROUTER_SUBSTITUTE,
    MoESite,
    class_named,
    literal,
    method_of,
)
from autoport_cst.transform.anatomy.mappings import entry_statement, mapping_entries
from autoport_cst.transform.cst.vocabulary import (
    code_of,
    is_call,
    is_docstring,
    simple_assign,
    string_text,
    walk,
)
from autoport_cst.transform.edit.tree import (
    insert_many_after,
    preceded_by,
    replace_nodes,
    replace_string_suffix,
)


def add_router_mapping(module, ctx, router_params, attr, suffix, after=()):
    """Add ``mappings[...<attr>]`` next to each router-weight entry (after an
    entry of one of ``after`` when present), its checkpoint key the router's
    with ``.weight`` replaced by ``suffix``."""

    def value_of(entry):
        return replace_string_suffix(entry.value, ".weight", suffix)

    refusal = "cannot derive the checkpoint key from the mapping of {key} (expected a key ending in .weight)"
    return _add_beside_router_entries(module, ctx, router_params, attr, value_of, refusal, after)


def _add_beside_router_entries(module, ctx, router_params, attr, value_of, refusal, after):
    """Add ``mappings[...<attr>]`` beside each router-weight entry that has
    none (after an entry of one of ``after`` when present), its value
    ``value_of(entry)``; a key or value that cannot be derived (None) is
    refused with ``refusal`` (``{key}``: the router entry's key)."""
    entries = mapping_entries(module)
    keys = {e.key for e in entries}
    router_entries = [e for e in entries if any(e.key.endswith(f".{p}") for p in router_params)]
    if not router_entries:
        wanted = " / ".join(sorted(router_params))
        raise ctx.refuse(f"load_weights has no mappings[...{wanted}] entry")
    additions: dict[int, list] = {}
    for entry in router_entries:
        param = next(p for p in router_params if entry.key.endswith(f".{p}"))
        base = entry.key[: -len(param)]
        if base + attr in keys:
            continue
        key = replace_string_suffix(entry.key_node, param, attr)
        value = value_of(entry)
        if key is None or value is None:
            raise ctx.refuse(refusal.format(key=entry.key), entry.statement, module)
        anchor = next((e for e in entries if any(e.key == base + a for a in after)), entry)
        additions.setdefault(id(anchor.statement), []).append(entry_statement(entry, key, value))
    return insert_many_after(module, additions)


# -- config aliases ------------------------------------------------------------------

ALIASES_NAME = "_ALIASES"


def add_config_alias(module: cst.Module, ctx, name: str, keys: tuple[str, ...]) -> cst.Module:
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
        if any(isinstance(e, cst.DictElement) and string_text(e.key) == name for e in table.elements):
            return module
        from autoport_cst.transform.cst.snippets import parse_expr

        keys_code = "(" + ", ".join(f'"{k}"' for k in keys) + ("," if len(keys) == 1 else "") + ")"
        element = cst.DictElement(parse_expr(f'"{name}"', module), parse_expr(keys_code, module))
        elements = list(table.elements)
        present = [string_text(e.key) if isinstance(e, cst.DictElement) else None for e in elements]
        index = next((i for i, k in enumerate(present) if k is not None and k > name), len(elements))
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
        return replace_nodes(module, {id(table): new_table})
    raise ctx.refuse(f"the config file has no {ALIASES_NAME} dict (field -> config keys that may hold it)")


# -- checkpoint keys of the router and its MoE block ----------------------------------


def router_key_parts(value: cst.BaseExpression) -> tuple[str, str] | None:
    """From a router weight's mapping value, the source of the router
    module's checkpoint key and of its MoE block's:
    ``f"{moe.router}.weight"`` -> (``moe.router``, ``moe.module``);
    ``f"{prefix}.mlp.gate.weight"`` -> (``f"{prefix}.mlp.gate"``, ``f"{prefix}.mlp"``)."""
    from autoport_cst.transform.cst.vocabulary import string_text

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


def add_router_mapping_value(module, ctx, router_params, attr, make_value, after=()):
    """Like :func:`add_router_mapping`, the value built by ``make_value(router,
    block)`` from the sources of the router's and the MoE block's keys."""
    from autoport_cst.transform.cst.snippets import parse_expr

    def value_of(entry):
        parts = router_key_parts(entry.value)
        return None if parts is None else parse_expr(make_value(*parts), module)

    refusal = (
        "cannot derive the router's checkpoint key from the mapping of {key} "
        '(expected f"{{moe.router}}.weight" or a key ending in .<router>.weight)'
    )
    return _add_beside_router_entries(module, ctx, router_params, attr, value_of, refusal, after)


# -- substitutes: NF.router and NF.moe_block_tkg op by op ------------------------------

TOPK_FUNCTION = '''
def _moe_topk_affinities(logits, top_k: int, activation: str, pre_norm: bool, norm_topk_prob: bool, selection_bias=None):
    """Router logits [T, E] -> float32 affinities [T, E], zero for the experts a
    token does not use. ``pre_norm``: every expert's score (softmax over all
    experts, or sigmoid) before the top-k, the chosen keep theirs; otherwise
    the activation over the chosen logits only. The top k are chosen by score
    plus ``selection_bias`` when given (a per-expert bias that moves the choice
    only, as DeepSeek-V3's ``e_score_correction_bias``). ``norm_topk_prob``:
    the chosen weights renormalized to sum to 1."""
    logits = logits.to(torch.float32)
    scores = torch.softmax(logits, dim=-1) if activation == "softmax" else torch.sigmoid(logits)
    if selection_bias is not None:
        choice = scores + selection_bias.reshape(-1).to(torch.float32)
    else:
        choice = scores if pre_norm else logits
    chosen = torch.topk(choice, top_k, dim=-1).indices
    if pre_norm:
        weights = scores.gather(-1, chosen)
    elif activation == "softmax":
        weights = torch.softmax(logits.gather(-1, chosen), dim=-1)
    else:
        weights = torch.sigmoid(logits.gather(-1, chosen))
    if norm_topk_prob:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return torch.zeros_like(scores).scatter(-1, chosen, weights)
'''

ROUTER_FUNCTION = '''
def _moe_router(
    hidden_states,
    router_weights,
    top_k: int,
    router_bias=None,
    activation: str = "softmax",
    computation_dtype=torch.float32,
    norm_topk_prob: bool = True,
    selection_bias=None,
):
    """NF.router with routing the kernel cannot express alone: the logits from
    NF.router, then every expert's score, the top k chosen by score (plus
    ``selection_bias``), the chosen scores renormalized when
    ``norm_topk_prob`` (``_moe_topk_affinities``). Affinities [T, E] in
    ``computation_dtype``."""
    _, logits = NF.router(
        hidden_states,
        router_weights=router_weights,
        top_k=top_k,
        router_bias=router_bias,
        activation=activation,
        return_logits=True,
        computation_dtype=computation_dtype,
    )
    affinities = _moe_topk_affinities(logits, top_k, activation, True, norm_topk_prob, selection_bias)
    return affinities.to(computation_dtype)
'''

BLOCK_FUNCTION = '''
def _moe_block_tkg_unfused(
    inp,
    gamma,
    router_weights,
    expert_gate_up_weights,
    expert_down_weights,
    *,
    top_k: int,
    eps: float,
    router_act_fn,
    expert_affinities_scaling_mode,
    hidden_act_fn,
    implementation,
    block_size: int,
    moe_group,
    tp_degree: int,
    rank_id=None,
    router_bias=None,
    expert_gate_up_bias=None,
    expert_down_bias=None,
    router_pre_norm: bool = True,
    norm_topk_prob: bool = False,
    gate_clamp_upper_limit=None,
    gate_clamp_lower_limit=None,
    up_clamp_upper_limit=None,
    up_clamp_lower_limit=None,
    router_mm_dtype=None,
    hidden_actual=None,
    is_all_expert: bool = False,
    skip_router_logits: bool = True,
    compute_dtype=None,
    selection_bias=None,
):
    """NF.moe_block_tkg op by op, for routing the fused kernel cannot express
    (``selection_bias``): the RMSNorm with ``gamma`` (over the first
    ``hidden_actual`` columns), the router matmul in ``router_mm_dtype``
    (float32 when not a torch dtype) with its bias, the top-k
    (``_moe_topk_affinities``), then this rank's experts (``rank_id`` names the
    expert-parallel rank when the rank holds fewer experts than the router
    scores) through NF.build_blockwise_mapping and NF.moe_cte. [T, H] partial
    sums, like the kernel with ``skip_router_logits``."""
    x = inp.reshape(-1, inp.shape[-1])
    width = x.shape[-1] if hidden_actual is None else hidden_actual
    x32 = x.to(torch.float32)
    variance = x32[:, :width].pow(2).mean(-1, keepdim=True)
    normed = (x32 * torch.rsqrt(variance + eps) * gamma.reshape(-1).to(torch.float32)).to(x.dtype)
    if hidden_actual is not None:
        normed = torch.cat([normed[:, :width], torch.zeros_like(normed[:, width:])], dim=-1)
    mm_dtype = router_mm_dtype if isinstance(router_mm_dtype, torch.dtype) else torch.float32
    logits = normed.to(mm_dtype).to(torch.float32) @ router_weights.to(mm_dtype).to(torch.float32)
    if router_bias is not None:
        logits = logits + router_bias.reshape(-1).to(torch.float32)
    activation = "softmax" if getattr(router_act_fn, "name", str(router_act_fn)).lower() == "softmax" else "sigmoid"
    affinities = _moe_topk_affinities(logits, top_k, activation, router_pre_norm, norm_topk_prob, selection_bias)
    local_experts = expert_gate_up_weights.shape[0]
    if local_experts < affinities.shape[1]:
        first = rank_id.reshape(-1)[:1].to(torch.int64) * local_experts
        local = first + torch.arange(local_experts, dtype=torch.int64, device=affinities.device)
        affinities = NF.get_local_expert_affinities(affinities, local)
    masked, token_position_to_id, block_to_expert, conditions = NF.build_blockwise_mapping(
        expert_affinities=affinities,
        num_local_experts=local_experts,
        num_experts_per_token=top_k,
        block_size=block_size,
        moe_group=moe_group,
        tp_degree=tp_degree,
    )
    options = {} if compute_dtype is None else {"compute_dtype": compute_dtype}
    return NF.moe_cte(
        implementation=implementation,
        conditions=conditions,
        hidden_states=normed,
        expert_affinities_masked=masked,
        gate_up_proj_weight=expert_gate_up_weights,
        down_proj_weight=expert_down_weights,
        gate_and_up_proj_bias=expert_gate_up_bias,
        down_proj_bias=expert_down_bias,
        activation_function=hidden_act_fn,
        block_size=block_size,
        token_position_to_id=token_position_to_id.to(torch.int32),
        block_to_expert=block_to_expert.to(torch.int32),
        expert_affinities_scaling_mode=expert_affinities_scaling_mode,
        skip_token=True,
        is_tensor_update_accumulating=True,
        gate_clamp_upper_limit=gate_clamp_upper_limit,
        gate_clamp_lower_limit=gate_clamp_lower_limit,
        up_clamp_upper_limit=up_clamp_upper_limit,
        up_clamp_lower_limit=up_clamp_lower_limit,
        **options,
    )
'''

# the keywords each substitute takes from the kernel call it replaces
ROUTER_SUBSTITUTE_KEYWORDS = (
    "hidden_states",
    "router_weights",
    "top_k",
    "router_bias",
    "activation",
    "computation_dtype",
)


BLOCK_SUBSTITUTE_KEYWORDS = (
    "inp",
    "gamma",
    "router_weights",
    "expert_gate_up_weights",
    "expert_down_weights",
    "top_k",
    "eps",
    "router_act_fn",
    "expert_affinities_scaling_mode",
    "hidden_act_fn",
    "rank_id",
    "router_bias",
    "expert_gate_up_bias",
    "expert_down_bias",
    "router_pre_norm",
    "norm_topk_prob",
    "gate_clamp_upper_limit",
    "gate_clamp_lower_limit",
    "up_clamp_upper_limit",
    "up_clamp_lower_limit",
    "router_mm_dtype",
    "hidden_actual",
    "is_all_expert",
    "skip_router_logits",
)


BLOCK_REQUIRED = ("top_k", "eps", "router_act_fn", "expert_affinities_scaling_mode", "hidden_act_fn")


def substitute_problems(site: MoESite) -> list[str]:
    """Why ``site`` cannot be replaced by its op-by-op substitute (empty: it can)."""
    call = site.call
    allowed: tuple[str, ...]
    if site.kind == "router":
        allowed, positional = ROUTER_SUBSTITUTE_KEYWORDS, 3
    elif site.kind == "block":
        allowed, positional = BLOCK_SUBSTITUTE_KEYWORDS, 5
    else:
        return [f"{site.name} has no op-by-op substitute"]
    problems = []
    if sum(1 for a in call.args if a.keyword is None) > positional or any(a.star for a in call.args):
        problems.append(f"{site.name} takes arguments by position beyond the substitute's")
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value not in allowed:
            problems.append(f"{site.name}({arg.keyword.value}=...) is not expressed op by op")
    if site.kind == "block":
        for name in BLOCK_REQUIRED:
            if literal(call, name) is None:
                problems.append(f"{site.name} is not given {name}= (the substitute needs it explicit)")
        if (literal(call, "skip_router_logits") or "False") != "True":
            problems.append(f"{site.name} returns the router logits (skip_router_logits is not True)")
        mode = literal(call, "expert_affinities_scaling_mode") or ""
        if not mode.endswith("POST_SCALE"):
            problems.append(f"{site.name}(expert_affinities_scaling_mode={mode}) is not POST_SCALE")
    return problems


def to_substitute(call: cst.Call, kind: str, extra: dict[str, cst.BaseExpression]) -> cst.Call:
    """``call`` as a call of its substitute, with the ``extra`` keywords."""
    from autoport_cst.transform.edit.arguments import set_keyword

    name = ROUTER_SUBSTITUTE if kind == "router" else BLOCK_SUBSTITUTE
    new = call.with_changes(func=cst.Name(name))
    for key, value in extra.items():
        new = set_keyword(new, key, value)
    return new


def substitute_functions(kinds: set[str]) -> list[str]:
    """The module functions the substitutes of ``kinds`` need."""
    functions = []
    if kinds & {"router", "router_sub", "block", "block_sub"}:
        functions.append(TOPK_FUNCTION)
    if kinds & {"router", "router_sub"}:
        functions.append(ROUTER_FUNCTION)
    if kinds & {"block", "block_sub"}:
        functions.append(BLOCK_FUNCTION)
    return functions


def blockwise_arguments(module: cst.Module, cls_name: str) -> dict[str, cst.BaseExpression] | None:
    """What the blockwise prefill of class ``cls_name`` passes to
    NF.build_blockwise_mapping (``block_size``, ``moe_group``, ``tp_degree``)
    and NF.moe_cte (``implementation``, ``compute_dtype``), for a decode
    substitute that runs the same kernels; None when the class runs neither."""
    from autoport_cst.transform.cst.vocabulary import keyword_arg

    cls = class_named(module, cls_name)
    if cls is None:
        return None
    mapping = [n for n in walk(cls) if isinstance(n, cst.Call) and is_call(n, "NF.build_blockwise_mapping")]
    cte = [n for n in walk(cls) if isinstance(n, cst.Call) and is_call(n, BLOCKWISE_KERNEL)]
    if not mapping or not cte:
        return None
    found: dict[str, cst.BaseExpression] = {}
    for call, names in (
        (mapping[0], ("block_size", "moe_group", "tp_degree")),
        (cte[0], ("implementation", "compute_dtype")),
    ):
        for name in names:
            arg = keyword_arg(call, name)
            if arg is not None:
                found[name] = arg.value
    if any(n not in found for n in ("block_size", "moe_group", "tp_degree", "implementation")):
        return None
    return found


# -- guards ----------------------------------------------------------------------------


def guard_site(module: cst.Module, ctx, site: MoESite, message: str, comment: str, edits: dict) -> None:
    """Make the path of ``site`` raise ``NotImplementedError(message)`` right
    before the statement that runs it, and declare the site guarded."""
    from autoport_cst.transform.cst.snippets import parse_statement
    from autoport_cst.transform.edit.kernels import innermost_statement, insert_before
    from autoport_cst.transform.edit.tree import with_comment

    func = method_of(module, site)
    holder = innermost_statement(func, site.call) if func is not None else None
    if func is None or holder is None:  # pragma: no cover - a site always sits in a method's statement
        raise ctx.refuse("cannot place a guard before this call", site.call, module)
    ctx.unaffected(site.call, f"guarded: {message}")
    text = message.replace("\\", "\\\\").replace('"', '\\"')
    if any(isinstance(n, cst.SimpleString) and n.value == f'"{text}"' for n in walk(func)):
        return
    stmt = parse_statement(f'raise NotImplementedError(\n    "{text}"\n)', module)
    insert_before(edits, holder, [with_comment(stmt, comment)])


def module_imports_name(module: cst.Module, name: str) -> bool:
    """Whether ``module`` binds ``name`` at its top level by an import."""
    for stmt in module.body:
        if not isinstance(stmt, cst.SimpleStatementLine):
            continue
        for small in stmt.body:
            if isinstance(small, (cst.Import, cst.ImportFrom)) and not isinstance(
                small.names, cst.ImportStar
            ):
                for alias in small.names:
                    bound = alias.asname.name if alias.asname else alias.name
                    if isinstance(bound, cst.Name) and bound.value == name:
                        return True
    return False


# -- load_weights ----------------------------------------------------------------------


def function_assigns(module: cst.Module, stmt: cst.CSTNode, name: str) -> bool:
    """Whether the function of ``module`` holding ``stmt`` assigns ``name``."""
    for node in walk(module):
        if isinstance(node, cst.FunctionDef) and any(n is stmt for n in walk(node)):
            for inner in walk(node):
                if isinstance(inner, cst.SimpleStatementLine):
                    pair = simple_assign(inner)
                    if pair is not None and isinstance(pair[0], cst.Name) and pair[0].value == name:
                        return True
            return False
    return False


def key_under(module_key: str, tensor: str) -> str:
    """Source of the checkpoint key ``<module_key>.<tensor>``, ``module_key``
    being the source of a string (``f"{prefix}.mlp.gate"``) or of an
    expression (``moe.router``)."""
    if module_key[:2] in ('f"', "f'") or module_key[:1] in ('"', "'"):
        return module_key[:-1] + f".{tensor}" + module_key[-1]
    return f'f"{{{module_key}}}.{tensor}"'


def has_config_aliases(module: cst.Module) -> bool:
    """Whether the config file has the ``_ALIASES`` table (field -> config keys)."""
    for stmt in module.body:
        if isinstance(stmt, cst.SimpleStatementLine):
            pair = simple_assign(stmt)
            if pair is not None and isinstance(pair[0], cst.Name) and pair[0].value == ALIASES_NAME:
                return True
    return False


def add_tensor_names(module: cst.Module, ctx, stmt: cst.CSTNode) -> cst.Module:
    """Give the ``load_weights`` holding ``stmt`` a ``names`` variable (the
    checkpoint's tensor names) as its first statement, read with the
    checkpoint class it loads with: ``SafetensorsCheckpoint(<path>, <cache_dir>)``."""
    from autoport_cst.transform.cst.snippets import parse_statement
    from autoport_cst.transform.cst.vocabulary import statements
    from autoport_cst.transform.edit.tree import rewrite

    for node in walk(module):
        if not (isinstance(node, cst.FunctionDef) and any(n is stmt for n in walk(node))):
            continue
        params = [p.name.value for p in node.params.params if p.name.value != "self"]
        makes = [n for n in walk(node) if isinstance(n, cst.Call) and is_call(n, "SafetensorsCheckpoint")]
        if not params or not makes:
            raise ctx.refuse(
                f"{node.name.value} has no names variable (the checkpoint's tensor names) "
                "and builds no SafetensorsCheckpoint to read them from",
                node,
                module,
            )
        args = ", ".join(
            code_of(a.value) if a.keyword is None else f"{a.keyword.value}={code_of(a.value)}"
            for a in makes[0].args
        )
        line = parse_statement(f"names = set(SafetensorsCheckpoint({args}).get_tensor_names())", module)
        line = line.with_changes(
            leading_lines=[
                cst.EmptyLine(
                    comment=cst.Comment(
                        "# <-- MODEL-SPECIFIC: the checkpoint's tensor names, for keys that differ by model"
                    )
                )
            ]
        )
        first = next((s for s in statements(node) if not is_docstring(s)), None)
        if first is None:  # pragma: no cover - load_weights has statements
            raise ctx.refuse(f"{node.name.value} is empty", node, module)
        return rewrite(module, {id(first): preceded_by(line)})
    raise ctx.refuse("the load_weights of the router mapping was not found", stmt, module)
