"""RoPE pairs of the checkpoint moved to the kernel's pairs (partial-rotary,
interleaved-rope): the column order each attention class computes and the
loaders of the query/key tensors wrapped to apply it."""

from __future__ import annotations

import libcst as cst

from autoport_cst.transform import FileContext
from autoport_cst.transform.anatomy.qkv import after_attrs, rope_targets, unknown_qk_tensors
from autoport_cst.transform.cst.vocabulary import (
    dotted,
    keyword_arg,
    nodes_of,
    self_assignment,
    statements,
    walk,
)


def reorder_rope_columns(
    module: cst.Module,
    ctx: FileContext,
    rotary_dim: str | None = None,
    interleaved: bool | None = None,
) -> cst.Module:
    """Give every attention class ``self.rope_column_order`` (built with the
    given ``rotary_dim`` expression and/or ``interleaved`` flag, keeping what
    another codemod set) and wrap every loader attached to a tensor laid out
    in query/key head columns (``rope_targets``: the fused QKV weight and
    bias, the query/key norm gammas), wherever it is attached and however it
    is built (a local, a rank wrapper, a loop), so that it loads reordered. A
    parameter mapped from query/key checkpoint tensors whose layout is
    unknown is refused; a quantized attention class is guarded."""
    from autoport_cst.transform.anatomy.attention import attention_classes_in
    from autoport_cst.transform.anatomy.classes import is_quantized
    from autoport_cst.transform.edit.functions import add_functions
    from autoport_cst.transform.edit.guards import declare_guarded, guard_edit
    from autoport_cst.transform.edit.imports import ensure_import_from
    from autoport_cst.transform.edit.tree import add_edit, rewrite

    edits: dict = {}
    done = False
    for cls in attention_classes_in(module, ctx):
        if is_quantized(cls):
            reason = f"RoPE columns reordered ({ctx.codemod}) in the quantized attention {cls.name.value}"
            for key, fn in guard_edit(cls, f"{reason} is not implemented", module).items():
                add_edit(edits, key, fn)
            declare_guarded(cls, ctx, reason)
            continue
        _order_setting(cls, module, ctx, rotary_dim, interleaved, edits)
        _wrap_loaders(cls, module, ctx, edits)
        done = True
    module = rewrite(module, edits)
    if not done:
        return module
    module = add_functions(module, [ROPE_ORDER_FUNCTION, ROPE_LOADER_FUNCTION])
    for imported in ("SafetensorsWeightLoader", "get_weight_loader", "set_weight_loader"):
        module = ensure_import_from(module, "vllm_neuron.utils.weight_loader", imported)
    return module


def _order_setting(cls, module, ctx, rotary_dim, interleaved, edits) -> None:
    """``self.rope_column_order = _rope_column_order(...)`` in ``__init__``,
    after the widths of the query and key heads (a new one, or the existing
    one with this codemod's part changed)."""
    from autoport_cst.transform.anatomy.classes import require_method
    from autoport_cst.transform.cst.snippets import parse_statement
    from autoport_cst.transform.edit.tree import with_comment

    name = cls.name.value
    init = require_method(module, ctx, cls, "__init__")
    existing, call = None, None
    for node in walk(init):
        if isinstance(node, cst.SimpleStatementLine):
            pair = self_assignment(node)
            if pair is not None and pair[0] == "rope_column_order":
                existing, call = node, pair[1]
    current_rotary, current_interleaved = "self.head_dim", "False"
    if existing is not None:
        if not (isinstance(call, cst.Call) and dotted(call.func) == "_rope_column_order"):
            raise ctx.refuse(
                f"{name}.rope_column_order is not built by _rope_column_order(...)",
                existing,
                module,
            )
        current_rotary, current_interleaved = _order_call_values(call)
    init_params = [p.name.value for p in init.params.params]
    config = init_params[1] if len(init_params) > 1 else "config"
    new_rotary = rotary_dim.format(config=config) if rotary_dim is not None else current_rotary
    new_interleaved = ("True" if interleaved else "False") if interleaved is not None else current_interleaved
    code = (
        f"self.rope_column_order = _rope_column_order(self.head_dim, "
        f"rotary_dim={new_rotary}, interleaved={new_interleaved})"
    )
    stmt = with_comment(parse_statement(code, module), ROPE_ORDER_COMMENT)
    if existing is not None:
        if module.code_for_node(existing.with_changes(leading_lines=[])).strip() != code:
            edits[id(existing)] = lambda updated, stmt=stmt: stmt.with_changes(
                leading_lines=updated.leading_lines
            )
        return
    anchor = None
    for attr in ("qkv_split_indices", "kv_size", "q_size"):
        anchor = next(
            (s for s in statements(init) if (p := self_assignment(s)) is not None and p[0] == attr), None
        )
        if anchor is not None:
            break
    if anchor is None:
        raise ctx.refuse(
            f"{name}.__init__ sets no self.q_size / self.kv_size (the widths of the query and key heads)",
            init,
            module,
        )
    anchor, missing = after_attrs(init, {"head_dim", "q_size", "kv_size"}, anchor)
    if missing:
        raise ctx.refuse(f"{name}.__init__ assigns no self.{', self.'.join(sorted(missing))}", init, module)
    append_after(edits, id(anchor), [stmt])


def _wrap_loaders(cls, module, ctx, edits) -> None:
    from autoport_cst.transform.anatomy.loaders import find_loaders
    from autoport_cst.transform.anatomy.norm import norm_has_bias
    from autoport_cst.transform.cst.snippets import parse_statement

    name = cls.name.value
    found = find_loaders(cls)
    targets = rope_targets(cls, norm_has_bias(module))
    unknown = unknown_qk_tensors(cls, module, {t for t, _ in targets})
    if unknown:
        param, keys = unknown[0]
        raise ctx.refuse(
            f"{name}.{param} is loaded from query/key checkpoint tensors ({keys}) in a layout the "
            "RoPE column reordering does not know; its columns would stay in the checkpoint's order",
            cls,
            module,
        )
    if "qkv_proj_weight" not in found:
        raise ctx.refuse(
            f"{name} attaches no loader to self.qkv_proj_weight "
            "(set_weight_loader(self.qkv_proj_weight, ...))",
            cls,
            module,
        )
    last = None
    by_name = []
    for target, width in targets:
        attachments = found.get(target, [])
        if any(_reorders(a.argument) for a in attachments):
            continue
        wrap = parse_statement(
            f"set_weight_loader(\n"
            f"    self.{target},\n"
            f"    _rope_columns_loader(get_weight_loader(self.{target}), self.rope_column_order, {width}),\n"
            f")",
            module,
        )
        if not attachments:
            by_name.append(wrap)  # a module's weight loaded by name (a norm's gamma)
            continue
        for attachment in attachments:
            append_after(edits, id(attachment.statement), [wrap])
            last = attachment.statement
    if by_name:
        anchor = last or found["qkv_proj_weight"][-1].statement
        append_after(edits, id(anchor), by_name)


def append_after(edits: dict, key: int, new: list[cst.BaseStatement]) -> None:
    """Record the insertion of ``new`` after the statement ``key`` (an id for
    ``rewrite``), after what earlier edits put there, whatever they return."""
    previous = edits.get(key)

    def edit(updated, previous=previous, new=new):
        base = previous(updated) if previous is not None else updated
        return cst.FlattenSentinel([*_nodes(base), *new])

    edits[key] = edit


def _reorders(argument: cst.BaseExpression) -> bool:
    """Whether a loader reorders the RoPE columns, itself or inside another
    codemod's wrapper (fused-query-gate's ``query_gate_rows_loader(...)``)."""
    calls = [node for node in nodes_of(argument, cst.Call) if isinstance(node, cst.Call)]
    return any(dotted(call.func) == "_rope_columns_loader" for call in calls)


def _nodes(updated) -> list:
    return list(updated.nodes) if isinstance(updated, cst.FlattenSentinel) else [updated]


# -- checkpoint RoPE pairs moved to the kernel's pairs (partial-rotary, interleaved-rope) ----

ROPE_ORDER_FUNCTION = '''
def _rope_column_order(head_dim: int, rotary_dim: int, interleaved: bool) -> list[int]:
    """The checkpoint column that each column of a query or key head comes from,
    so that the checkpoint's rotated pairs land on the pairs (i, i + head_dim / 2)
    that the RoPE here and the decode kernel rotate together.

    The checkpoint rotates the first ``rotary_dim`` columns of each head, in
    pairs (j, j + rotary_dim / 2), or (2j, 2j + 1) when ``interleaved``; the
    other columns pass through. Pair i < rotary_dim / 2 here is the
    checkpoint's pair j = i; the pass-through columns fill the other places in
    order (the cos/sin tables rotate them by angle zero). Queries and keys are
    reordered alike, so their dot products do not change.
    """
    half, rotary_half = head_dim // 2, rotary_dim // 2
    if interleaved:
        first = [2 * j for j in range(rotary_half)]
        second = [2 * j + 1 for j in range(rotary_half)]
    else:
        first = list(range(rotary_half))
        second = [rotary_half + j for j in range(rotary_half)]
    rest = list(range(rotary_dim, head_dim))
    return first + rest[: half - rotary_half] + second + rest[half - rotary_half :]
'''

ROPE_LOADER_FUNCTION = '''
def _rope_columns_loader(loader, order: list[int], width: int):
    """Wrap a weight loader: reorder the columns of each head, by ``order``,
    in the first ``width`` entries of the loaded tensor's last dimension (the
    query and key heads of a fused [q | k | v] weight or bias, or a norm's
    gammas); the rest (values) is left as it is."""
    head_dim = len(order)

    def transform(slices, rank):
        tensor = loader.load(slices, rank)
        index = torch.arange(tensor.shape[-1])
        starts = torch.arange(0, width, head_dim).repeat_interleave(head_dim)
        index[:width] = torch.tensor(order).repeat(width // head_dim) + starts
        return tensor[..., index]

    return SafetensorsWeightLoader(transform)
'''

ROPE_ORDER_COMMENT = (
    "<-- MODEL-SPECIFIC: checkpoint RoPE pairs moved to the pairs (i, i + head_dim / 2) rotated here"
)


def _order_call_values(call: cst.Call) -> tuple[str, str]:
    args = list(call.args)
    rotary = keyword_arg(call, "rotary_dim")
    interleaved = keyword_arg(call, "interleaved")
    if rotary is None and len(args) > 1 and args[1].keyword is None:
        rotary = args[1]
    if interleaved is None and len(args) > 2 and args[2].keyword is None:
        interleaved = args[2]
    module = cst.Module([])
    return (
        module.code_for_node(rotary.value) if rotary is not None else "self.head_dim",
        module.code_for_node(interleaved.value) if interleaved is not None else "False",
    )
