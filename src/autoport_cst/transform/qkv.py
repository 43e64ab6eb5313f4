"""The query/key/value projection of an attention class: its calls, the
loaders of the tensors laid out like it, and where new per-layer settings
may go (this module is not a codemod).

The real vllm_neuron attention classes project q, k and v in several places:
``NF.qkv_proj`` in prefill (a plain call, and in chunked prefill a call with
``use_block_kv=True`` that also writes the paged cache), sometimes with RoPE
fused into it (``cos_cache``/``sin_cache``), and the decode kernel
``NF.attention_decode`` (or its op-by-op substitute). A codemod that changes
the projection (a bias, q/k norms) changes each of them: :func:`projections`
lists them, and :func:`stray_reads` names any other read of the projection's
weights, which the codemod then refuses.

Tensors laid out like the fused ``[q | k | v]`` projection (its bias, the
weights of a norm over all query heads) are sharded exactly as its weight
loader shards the weight, attention data parallelism included: their loaders
take the same arguments (:func:`qkv_loader_arguments`).
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from autoport_cst.transform import FileContext
from autoport_cst.transform.anatomy.sites import is_forward_method
from autoport_cst.transform.cst_helpers import (
    code_of,
    dotted,
    keyword_arg,
    self_assignment,
    self_attr,
    statements,
    walk,
)

DECODE_KERNELS = ("NF.attention_decode", "_attention_decode_unfused")
QKV_PROJ_UNFUSED = "_qkv_proj_unfused"

# -- the projection calls ----------------------------------------------------------------


@dataclass(frozen=True)
class Projection:
    """One place an attention class projects q, k and v: ``kind`` is
    ``prefill`` (``NF.qkv_proj`` or its substitute) or ``decode`` (the decode
    kernel or its substitute)."""

    call: cst.Call
    kind: str
    method: cst.FunctionDef

    @property
    def fused_rope(self) -> bool:
        """A prefill projection that also rotates q and k (``cos_cache`` and
        ``sin_cache`` given)."""
        return self.kind == "prefill" and all(
            (arg := keyword_arg(self.call, name)) is not None and dotted(arg.value) != "None"
            for name in ("cos_cache", "sin_cache")
        )


def _last(name: str | None) -> str:
    return (name or "").rsplit(".", 1)[-1]


def projection_kind(call: cst.Call) -> str | None:
    name = dotted(call.func)
    if name is None or name.startswith("self."):
        return None
    if _last(name) in ("qkv_proj", QKV_PROJ_UNFUSED):
        return "prefill"
    if _last(name) in [_last(k) for k in DECODE_KERNELS]:
        return "decode"
    return None


def forward_methods(cls: cst.ClassDef) -> list[cst.FunctionDef]:
    body = cls.body.body if isinstance(cls.body, cst.IndentedBlock) else []
    return [s for s in body if isinstance(s, cst.FunctionDef) and is_forward_method(s)]


def projections(cls: cst.ClassDef) -> list[Projection]:
    """Every projection call in the forward methods of ``cls``."""
    found = []
    for func in forward_methods(cls):
        for node in walk(func):
            if isinstance(node, cst.Call) and (kind := projection_kind(node)) is not None:
                found.append(Projection(node, kind, func))
    return found


def stray_reads(cls: cst.ClassDef, attr: str, handled: list[cst.Call]) -> cst.CSTNode | None:
    """The first read of ``self.<attr>`` in a forward method of ``cls`` that
    is not inside one of the ``handled`` calls (a computation with the
    tensor that a codemod changing it would leave as it is)."""
    inside = {id(n) for call in handled for n in walk(call)}
    for func in forward_methods(cls):
        for node in walk(func):
            if id(node) not in inside and self_attr(node) == attr:
                return node
    return None


# -- loaders of tensors laid out like the projection ------------------------------------------

# fused_qkv_weight_loader's parameters, in order
QKV_LOADER_PARAMETERS = (
    "q_size",
    "kv_size",
    "shard_dim",
    "num_shards",
    "is_storage_transposed",
    "num_kv_replicas",
    "padded_hidden_size",
    "unpadded_hidden_size",
    "attention_dp_rank",
    "attention_dp_size",
    "kv_sharded_across_attention_dp",
)
# those that say which rows of q, k and v a rank holds (the others lay out
# the weight's hidden dimension, which a bias or a norm weight does not have)
QKV_SHARDING = (
    "q_size",
    "kv_size",
    "num_shards",
    "num_kv_replicas",
    "attention_dp_rank",
    "attention_dp_size",
    "kv_sharded_across_attention_dp",
)
ATTENTION_DP = ("attention_dp_rank", "attention_dp_size", "kv_sharded_across_attention_dp")


def qkv_loader_arguments(call: cst.Call) -> tuple[dict[str, str], list[cst.Arg]]:
    """``(sharding arguments, unknown arguments)`` of a
    ``fused_qkv_weight_loader(...)`` call: the code of each argument in
    ``QKV_SHARDING``, by name (positional ones by the signature), and the
    arguments that are not its parameters (``*args``, ``**kwargs``, other names)."""
    found: dict[str, str] = {}
    unknown: list[cst.Arg] = []
    position = 0
    for arg in call.args:
        if arg.star:
            unknown.append(arg)
            continue
        if arg.keyword is None:
            name = QKV_LOADER_PARAMETERS[position] if position < len(QKV_LOADER_PARAMETERS) else None
            position += 1
        else:
            name = arg.keyword.value
        if name is None or name not in QKV_LOADER_PARAMETERS:
            unknown.append(arg)
        elif name in QKV_SHARDING:
            found[name] = code_of(arg.value).strip()
    return found, unknown


BIAS_LOADER_DP = '''
def fused_qkv_bias_loader(
    q_size,
    kv_size,
    num_shards,
    num_kv_replicas=1,
    attention_dp_rank=0,
    attention_dp_size=1,
    kv_sharded_across_attention_dp=False,
):
    """Loader for a fused [q | k | v] bias from separate q, k and v bias tensors,
    sharded like fused_qkv_weight_loader shards the weight.

    Each rank takes its slice of the query bias, and the slice of the key and
    value biases of the KV heads it holds (ranks share a KV head when there are
    fewer KV heads than ranks). With attention data parallelism the query heads
    are sharded over the TP x DP ranks (query rank ``attention_dp_rank + tp_rank
    * attention_dp_size``), and the KV heads too when
    ``kv_sharded_across_attention_dp``.
    """

    def transform(slices, rank):
        if len(slices) != 3:
            raise ValueError(f"fused QKV bias expects q, k and v tensors, got {len(slices)}")
        tp_rank = rank % num_shards
        q_rank = attention_dp_rank + tp_rank * attention_dp_size
        kv_rank = q_rank if kv_sharded_across_attention_dp else tp_rank // num_kv_replicas
        q = slices[0][q_rank * q_size : (q_rank + 1) * q_size]
        k = slices[1][kv_rank * kv_size : (kv_rank + 1) * kv_size]
        v = slices[2][kv_rank * kv_size : (kv_rank + 1) * kv_size]
        return torch.cat([q, k, v], dim=0)

    return SafetensorsWeightLoader(transform)
'''


def function_parameters(module: cst.Module, name: str) -> list[str] | None:
    """The parameter names of the module-level function ``name`` (None when
    the module defines no such function)."""
    for stmt in module.body:
        if isinstance(stmt, cst.FunctionDef) and stmt.name.value == name:
            return [
                p.name.value
                for p in (*stmt.params.posonly_params, *stmt.params.params, *stmt.params.kwonly_params)
            ]
    return None


# -- prefill projection with a q/k norm no kernel fuses ------------------------------------

QKV_PROJ_UNFUSED_FUNCTION = '''
def _qkv_proj_unfused(
    hidden,
    qkv_weights,
    bias=None,
    d_head=None,
    cos_cache=None,
    sin_cache=None,
    num_q_heads=None,
    num_kv_heads=None,
    k_cache=None,
    v_cache=None,
    use_block_kv=False,
    block_size=None,
    slot_mapping=None,
    qk_norm=None,
):
    """NF.qkv_proj with RoPE computed op by op, for a q/k norm the kernel
    cannot fuse: ``qk_norm`` (a function of q [Nq, T, Dh] and k [Nkv, T, Dh],
    such as a norm over all heads) applied before RoPE.

    The kernel's arguments and results: hidden [B, S, H] projected to
    [B, S, q | k | v]; split-half RoPE of the q and k heads with cos/sin
    caches [B, S, Dh]; with ``use_block_kv`` the rotated keys and the values
    are written to the paged caches [blocks, Nkv, block, Dh] at
    ``slot_mapping`` and ``(q, k_cache, v_cache)`` is returned.
    """
    qkv = NF.qkv_proj(hidden=hidden, qkv_weights=qkv_weights, bias=bias)
    batch, seq, _ = qkv.shape
    q_width, kv_width = num_q_heads * d_head, num_kv_heads * d_head
    q, k, v = qkv[..., :q_width], qkv[..., q_width : q_width + kv_width], qkv[..., q_width + kv_width :]
    q = q.reshape(batch * seq, num_q_heads, d_head).transpose(0, 1)
    k = k.reshape(batch * seq, num_kv_heads, d_head).transpose(0, 1)
    if qk_norm is not None:
        q, k = qk_norm(q, k)
    if cos_cache is not None and sin_cache is not None:
        cos = cos_cache.reshape(batch * seq, d_head)
        sin = sin_cache.reshape(batch * seq, d_head)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
    q = q.transpose(0, 1).reshape(batch, seq, q_width)
    k = k.transpose(0, 1).reshape(batch, seq, kv_width)
    if not use_block_kv:
        return torch.cat((q, k, v), dim=-1)
    slots = slot_mapping.reshape(-1).to(torch.int64)
    blocks = (slots // block_size).repeat(num_kv_heads)
    offsets = (slots % block_size).repeat(num_kv_heads)
    heads = torch.arange(num_kv_heads, device=hidden.device).repeat_interleave(slots.shape[0])
    for cache, new in ((k_cache, k), (v_cache, v)):
        rows = new.reshape(batch * seq, num_kv_heads, d_head).transpose(0, 1).reshape(-1, d_head)
        cache.index_put_((blocks, heads, offsets), rows.to(cache.dtype))
    return q, k_cache, v_cache
'''

QKV_PROJ_UNFUSED_PARAMETERS = (
    "hidden",
    "qkv_weights",
    "bias",
    "d_head",
    "cos_cache",
    "sin_cache",
    "num_q_heads",
    "num_kv_heads",
    "k_cache",
    "v_cache",
    "use_block_kv",
    "block_size",
    "slot_mapping",
    "qk_norm",
)


def unsupported_arguments(call: cst.Call, parameters: tuple[str, ...]) -> list[str]:
    """Arguments of ``call`` a substitute with ``parameters`` cannot take:
    positional ones, ``*args``/``**kwargs`` and unknown keywords."""
    out = []
    for arg in call.args:
        if arg.star:
            out.append(f"{arg.star}{code_of(arg.value)}")
        elif arg.keyword is None:
            out.append(f"positional {code_of(arg.value)}")
        elif arg.keyword.value not in parameters:
            out.append(arg.keyword.value)
    return out


# -- where new per-layer settings go in __init__ ----------------------------------------------


def assigned_attrs(stmt: cst.CSTNode) -> set[str]:
    """``self`` attributes assigned anywhere in a top-level statement."""
    found = set()
    for node in walk(stmt):
        if isinstance(node, cst.SimpleStatementLine):
            pair = self_assignment(node)
            if pair is not None:
                found.add(pair[0])
    return found


def after_attrs(
    init: cst.FunctionDef, attrs: set[str], default: cst.BaseStatement | None
) -> tuple[cst.BaseStatement | None, set[str]]:
    """The top-level statement of ``init`` after which statements reading
    ``self.<attr>`` for every attr of ``attrs`` may go: ``default`` when all
    are assigned by then, else the statement assigning the last of them.
    Returns ``(anchor, attrs never assigned in init)``."""
    body = list(statements(init))
    first: dict[str, int] = {}
    for index, stmt in enumerate(body):
        for attr in assigned_attrs(stmt):
            first.setdefault(attr, index)
    missing = {a for a in attrs if a not in first}
    needed = max((first[a] for a in attrs if a in first), default=-1)
    start = body.index(default) if default is not None and default in body else -1
    if start >= needed:
        return default, missing
    return (body[needed] if needed >= 0 else default), missing


def self_attribute_behind(loader, code: str) -> str | None:
    """The ``self`` attribute an argument of ``loader``'s call holds: ``x``
    for ``self.x``, or for a local bound to ``self.x`` (``ddp =
    self.attention_dp_size``) before the loader's statement in its function."""
    from autoport_cst.transform.cst_helpers import parse_expr
    from autoport_cst.transform.loaders import placed_statements, plain_binding

    expr = parse_expr(code)
    for _ in range(10):
        attr = self_attr(expr)
        if attr is not None:
            return attr
        if not isinstance(expr, cst.Name):
            return None
        placed = placed_statements(loader.function)
        at = next((p.index for p in placed if p.stmt is loader.placed.stmt), len(placed))
        values = [v for p in placed[:at] if (v := plain_binding(p.stmt, expr.value)) is not None]
        if not values:
            return None
        expr = values[-1]
    return None


# -- RoPE parameters in the config ------------------------------------------------------------

ROPE_DICTS = ("rope_parameters", "rope_scaling")

PARTIAL_FACTOR_TEMPLATE = '''
def _partial_rotary_factor(config) -> float:
    """Fraction of each head that RoPE rotates: the config field, else the value
    in the RoPE parameters, else 1 (the whole head)."""
    if config.partial_rotary_factor is not None:
        return float(config.partial_rotary_factor)
    return float((config.{rope_dict} or {{}}).get("partial_rotary_factor", 1.0))
'''


def rope_dict_attribute(module: cst.Module) -> str | None:
    """The config attribute holding the RoPE parameters that ``module``
    reads (``config.rope_parameters[...]``, transformers v5's name, or
    ``config.rope_scaling``); None when it reads neither."""
    read = {n.attr.value for n in walk(module) if isinstance(n, cst.Attribute) and n.attr.value in ROPE_DICTS}
    return next((name for name in ROPE_DICTS if name in read), None)


def partial_factor_function(module: cst.Module) -> str:
    """``_partial_rotary_factor`` reading the RoPE parameters where this
    model file's config keeps them (``rope_parameters`` when it reads
    neither: the config codemod then adds that field)."""
    return PARTIAL_FACTOR_TEMPLATE.format(rope_dict=rope_dict_attribute(module) or "rope_parameters")


def mentions(module: cst.Module, name: str) -> bool:
    """Whether ``name`` occurs in ``module`` as a name, an attribute or a string."""
    for node in walk(module):
        if isinstance(node, cst.Name) and node.value == name:
            return True
        if isinstance(node, cst.SimpleString) and name in node.value:
            return True
    return False


# -- RoPE pairs of the checkpoint moved to the kernel's pairs (partial-rotary, interleaved-rope) ---

# per-head gammas held as bare parameters (qwen3_moe): (parameter, width)
BARE_NORM_GAMMAS = (("q_norm_weight", "self.head_dim"), ("k_norm_weight", "self.head_dim"))
QK_CHECKPOINT_PARTS = (".q_proj.", ".k_proj.", ".q_norm.", ".k_norm.", "qkv_proj")


def rope_targets(cls: cst.ClassDef) -> list[tuple[str, str]]:
    """``(parameter path after self., width of its query/key part)`` of every
    tensor of ``cls`` laid out in query/key head columns: the fused QKV weight
    and bias, and the query/key norm gammas (per head, or over all heads)."""
    from autoport_cst.transform.attention import (
        ROPE_REORDERED,
        find_self_assignment_deep,
        norm_is_full_width,
        self_parameters,
    )

    params = self_parameters(cls)
    targets = [(p, width) for p, width in ROPE_REORDERED if p in params]
    init = next(
        (s for s in cls.body.body if isinstance(s, cst.FunctionDef) and s.name.value == "__init__"), None
    )
    for norm in ("q_norm", "k_norm"):
        if init is not None and find_self_assignment_deep(init, norm) is not None:
            width = "self.head_dim"
            if norm_is_full_width(cls, norm):
                width = "self.q_size" if norm == "q_norm" else "self.kv_size"
            targets.append((f"{norm}.weight", width))
    targets += [(p, width) for p, width in BARE_NORM_GAMMAS if p in params]
    return targets


def unknown_qk_tensors(cls: cst.ClassDef, module: cst.Module, known: set[str]) -> list[tuple[str, str]]:
    """``(parameter, checkpoint keys)`` of the parameters of ``cls`` that this
    file's ``load_weights`` maps from query/key checkpoint tensors but whose
    layout ``rope_targets`` does not know."""
    from autoport_cst.transform.attention import self_parameters
    from autoport_cst.transform.mappings import mapping_entries

    entries = mapping_entries(module)
    found = []
    for param in self_parameters(cls):
        if param in known or param.startswith("o_proj"):
            continue
        for entry in entries:
            if not entry.key.endswith(f".{param}"):
                continue
            text = code_of(entry.value)
            if any(part in text for part in QK_CHECKPOINT_PARTS):
                found.append((param, " ".join(text.split())))
    return found


def reorder_rope_columns(
    module: cst.Module,
    ctx: FileContext,
    codemod_id: str,
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
    from autoport_cst.transform.attention import (
        ROPE_LOADER_FUNCTION,
        ROPE_ORDER_FUNCTION,
        add_functions,
    )
    from autoport_cst.transform.cst_helpers import ensure_import_from, rewrite
    from autoport_cst.transform.kernels import attention_classes_in
    from autoport_cst.transform.layers import add_edit
    from autoport_cst.transform.loaders import declare_guarded, guard_edit, is_quantized

    edits: dict = {}
    done = False
    for cls in attention_classes_in(module, ctx, codemod_id):
        if is_quantized(cls):
            reason = f"RoPE columns reordered ({codemod_id}) in the quantized attention {cls.name.value}"
            for key, fn in guard_edit(cls, f"{reason} is not implemented", module).items():
                add_edit(edits, key, fn)
            declare_guarded(cls, ctx, reason)
            continue
        _order_setting(cls, module, ctx, codemod_id, rotary_dim, interleaved, edits)
        _wrap_loaders(cls, module, ctx, codemod_id, edits)
        done = True
    module = rewrite(module, edits)
    if not done:
        return module
    module = add_functions(module, [ROPE_ORDER_FUNCTION, ROPE_LOADER_FUNCTION])
    for imported in ("SafetensorsWeightLoader", "get_weight_loader", "set_weight_loader"):
        module = ensure_import_from(module, "vllm_neuron.utils.weight_loader", imported)
    return module


def _order_setting(cls, module, ctx, codemod_id, rotary_dim, interleaved, edits) -> None:
    """``self.rope_column_order = _rope_column_order(...)`` in ``__init__``,
    after the widths of the query and key heads (a new one, or the existing
    one with this codemod's part changed)."""
    from autoport_cst.transform.attention import ROPE_ORDER_COMMENT, _order_call_values
    from autoport_cst.transform.cst_helpers import parse_statement, with_comment
    from autoport_cst.transform.layers import require_method

    name = cls.name.value
    init = require_method(cls, "__init__", ctx, module, codemod_id)
    existing, call = None, None
    for node in walk(init):
        if isinstance(node, cst.SimpleStatementLine):
            pair = self_assignment(node)
            if pair is not None and pair[0] == "rope_column_order":
                existing, call = node, pair[1]
    current_rotary, current_interleaved = "self.head_dim", "False"
    if existing is not None:
        if not (isinstance(call, cst.Call) and dotted(call.func) == "_rope_column_order"):
            raise ctx.precondition(
                f"{codemod_id}: {name}.rope_column_order is not built by _rope_column_order(...)",
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
        raise ctx.precondition(
            f"{codemod_id}: {name}.__init__ sets no self.q_size / self.kv_size (the widths of the query and key heads)",
            init,
            module,
        )
    anchor, missing = after_attrs(init, {"head_dim", "q_size", "kv_size"}, anchor)
    if missing:
        raise ctx.precondition(
            f"{codemod_id}: {name}.__init__ assigns no self.{', self.'.join(sorted(missing))}", init, module
        )
    append_after(edits, id(anchor), [stmt])


def _wrap_loaders(cls, module, ctx, codemod_id, edits) -> None:
    from autoport_cst.transform.cst_helpers import parse_statement
    from autoport_cst.transform.loaders import find_loaders

    name = cls.name.value
    found = find_loaders(cls)
    targets = rope_targets(cls)
    unknown = unknown_qk_tensors(cls, module, {t for t, _ in targets})
    if unknown:
        param, keys = unknown[0]
        raise ctx.precondition(
            f"{codemod_id}: {name}.{param} is loaded from query/key checkpoint tensors ({keys}) in a layout the "
            "RoPE column reordering does not know; its columns would stay in the checkpoint's order",
            cls,
            module,
        )
    if "qkv_proj_weight" not in found:
        raise ctx.precondition(
            f"{codemod_id}: {name} attaches no loader to self.qkv_proj_weight "
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
    return isinstance(argument, cst.Call) and dotted(argument.func) == "_rope_columns_loader"


def _nodes(updated) -> list:
    return list(updated.nodes) if isinstance(updated, cst.FlattenSentinel) else [updated]
