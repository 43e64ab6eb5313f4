"""Shared CST helpers of the attention and RoPE codemods (this module is not a
codemod: the library skips files whose name starts with ``_``).

Everything here finds its targets structurally (class roles, parameter and
method names, ``NF.*`` calls) and inserts code at positions that do not
depend on the order in which codemods run, so that codemods using these
helpers commute with each other:

- config fields go right before ``torch_dtype`` (or after the last field),
  after any of the fields just above it whose names sort before theirs;
- module-level helper functions go before the first class, after any of the
  functions just above it whose names sort before theirs.
"""

from __future__ import annotations

import libcst as cst

from autoport_cst.transform import FileContext
from autoport_cst.transform.cst_helpers import (
    classes_with_role,
    dotted,
    is_call,
    keyword_arg,
    method,
    parse_statement,
    rewrite,
    self_assignment,
    walk,
    with_comment,
)
from autoport_cst.transform.layers import is_parameter, require_method

# -- finding targets -------------------------------------------------------------


def self_parameters(cls: cst.ClassDef) -> dict[str, cst.SimpleStatementLine]:
    """``self.<name> = nn.Parameter(...)`` statements of a class, by name."""
    found: dict[str, cst.SimpleStatementLine] = {}
    for node in walk(cls):
        if isinstance(node, cst.SimpleStatementLine):
            pair = self_assignment(node)
            if pair is not None and is_parameter(pair[1]):
                found.setdefault(pair[0], node)
    return found


def attention_classes(module: cst.Module, ctx: FileContext, codemod_id: str) -> list[cst.ClassDef]:
    """Attention classes with a fused ``self.qkv_proj_weight`` parameter."""
    found = [
        c for c in classes_with_role(module, "attention") if "qkv_proj_weight" in self_parameters(c)
    ]
    if not found:
        raise ctx.precondition(
            f"{codemod_id}: no attention class (<Prefix>Attention with "
            "self.qkv_proj_weight = nn.Parameter(...)) in this file"
        )
    return found


def init_anchor(init: cst.FunctionDef, attrs: tuple[str, ...] = ("scaling", "head_dim", "layer_idx")):
    """The top-level ``self.<attr> = ...`` statement of ``__init__`` to insert
    per-layer settings after: the first of ``attrs`` found."""
    body = init.body.body if isinstance(init.body, cst.IndentedBlock) else []
    for attr in attrs:
        for stmt in body:
            pair = self_assignment(stmt)
            if pair is not None and pair[0] == attr:
                return stmt
    return None


def place_setting(init: cst.FunctionDef, attr: str, stmt: cst.BaseStatement, edits: dict) -> bool:
    """Record in ``edits`` the insertion of ``stmt`` (``self.<attr> = ...``
    with a comment) among the per-layer settings that follow ``init_anchor``:
    after the anchor and after the settings other codemods placed there whose
    names sort before ``attr`` (statements led by a MODEL-SPECIFIC comment),
    so that the order does not depend on which codemod ran first. Returns
    False when ``__init__`` has no anchor."""
    body = list(init.body.body) if isinstance(init.body, cst.IndentedBlock) else []
    anchor = init_anchor(init)
    if anchor is None:
        return False
    index = body.index(anchor)
    while index + 1 < len(body):
        following = body[index + 1]
        pair = self_assignment(following)
        marked = any(
            line.comment is not None and line.comment.value.startswith("# <-- MODEL-SPECIFIC")
            for line in getattr(following, "leading_lines", ())
        )
        if pair is None or not marked or pair[0] >= attr:
            break
        index += 1
    target = body[index]
    previous = edits.get(id(target))

    def place(updated, previous=previous, stmt=stmt):
        base = previous(updated) if previous else updated
        nodes = list(base.nodes) if isinstance(base, cst.FlattenSentinel) else [base]
        return cst.FlattenSentinel([*nodes, stmt])

    edits[id(target)] = place
    return True


def calls_in(node: cst.CSTNode, name: str) -> list[cst.Call]:
    return [n for n in walk(node) if isinstance(n, cst.Call) and is_call(n, name)]


def statement_containing(func: cst.FunctionDef, target: cst.CSTNode) -> cst.BaseStatement | None:
    """The top-level statement of ``func``'s body that contains ``target``."""
    body = func.body.body if isinstance(func.body, cst.IndentedBlock) else []
    for stmt in body:
        if any(n is target for n in walk(stmt)):
            return stmt
    return None


def norm_class(module: cst.Module) -> cst.ClassDef | None:
    norms = [c for c in classes_with_role(module, "norm")]
    return norms[0] if len(norms) == 1 else None


def eps_attribute(norm: cst.ClassDef) -> str | None:
    """The epsilon attribute a norm class stores (``variance_epsilon``)."""
    init = method(norm, "__init__")
    if init is None:
        return None
    for node in walk(init):
        if isinstance(node, cst.SimpleStatementLine):
            pair = self_assignment(node)
            if pair is not None and "eps" in pair[0]:
                return pair[0]
    return None


# -- call arguments -----------------------------------------------------------------


# -- comments -----------------------------------------------------------------------


# -- config dataclass ---------------------------------------------------------------


# -- module-level helper functions -------------------------------------------------


def add_functions(module: cst.Module, functions: list[str], replace: bool = False) -> cst.Module:
    """Add module-level functions (source text) not yet defined, before the
    first class of the module. With ``replace``, a function of the same name
    whose text differs is replaced in place."""
    body = list(module.body)
    changed = False
    for code in functions:
        func = parse_statement(code.strip("\n"), module)
        assert isinstance(func, cst.FunctionDef), code
        name = func.name.value
        existing = next(
            (i for i, s in enumerate(body) if isinstance(s, cst.FunctionDef) and s.name.value == name), None
        )
        if existing is not None:
            old = body[existing]
            if replace and not old.with_changes(leading_lines=[]).deep_equals(func.with_changes(leading_lines=[])):
                body[existing] = func.with_changes(leading_lines=old.leading_lines)
                changed = True
            continue
        func = func.with_changes(leading_lines=[cst.EmptyLine(indent=False), cst.EmptyLine(indent=False)])
        first_class = next((i for i, s in enumerate(body) if isinstance(s, cst.ClassDef)), len(body))
        position = first_class
        while (
            position > 0
            and isinstance(body[position - 1], cst.FunctionDef)
            and body[position - 1].name.value > name
        ):
            position -= 1
        if position == 0:
            func = func.with_changes(leading_lines=body[0].leading_lines if body else [])
            if body:
                body[0] = body[0].with_changes(
                    leading_lines=[cst.EmptyLine(indent=False), cst.EmptyLine(indent=False)]
                )
        body.insert(position, func)
        changed = True
    return module.with_changes(body=body) if changed else module


# -- decode computed op by op ----------------------------------------------------------

UNFUSED_DECODE_CALL = "_attention_decode_unfused"

DECODE_UNFUSED = '''
def _attention_decode_unfused(
    X,
    W_qkv,
    K_cache,
    V_cache,
    attention_mask,
    active_blocks_table,
    cos,
    sin,
    softmax_scale,
    kv_cache_update_idx,
    W_out,
    bias_qkv=None,
    bias_out=None,
    sink=None,
    update_cache=True,
    rmsnorm_QK_pre_rope_enabled=False,
    rmsnorm_QK_pre_rope_eps=1e-6,
    rmsnorm_QK_pre_rope_W_Q=None,
    rmsnorm_QK_pre_rope_W_K=None,
    qk_norm=None,
    softcap=None,
    **kernel_options,
):
    """NF.attention_decode computed op by op, for what the fused decode kernel
    cannot do: ``qk_norm`` (a function of q [Nq, T, Dh] and k [Nkv, T, Dh]
    applied before RoPE, such as a norm over all heads) and ``softcap`` (tanh
    softcapping of the attention scores).

    Same arguments and layouts as the kernel with ``update_cache=True``:
    caches [blocks, Nkv, block, Dh], cos/sin [Dh/2, B, S], attention_mask
    [context, B, Nq, S] whose last S slots are the active tokens. Returns
    [B * S, H].
    """
    enabled = [
        name
        for name in ("rmsnorm_X_enabled", "rmsnorm_QK_post_rope_enabled", "K_cache_transposed", "transposed_out")
        if kernel_options.get(name)
    ]
    if enabled or not update_cache:
        raise NotImplementedError(
            f"the unfused decode path does not implement {enabled or ['update_cache=False']}"
        )
    batch, seq, _ = X.shape
    tokens = batch * seq
    _, kv_heads, block_size, head_dim = K_cache.shape
    qkv = NF.qkv_proj(hidden=X, qkv_weights=W_qkv, bias=bias_qkv).reshape(tokens, -1)
    q_heads = qkv.shape[-1] // head_dim - 2 * kv_heads
    q, k, v = torch.split(qkv, [q_heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    q = q.reshape(tokens, q_heads, head_dim).transpose(0, 1)
    k = k.reshape(tokens, kv_heads, head_dim).transpose(0, 1)
    v = v.reshape(tokens, kv_heads, head_dim).transpose(0, 1)
    if rmsnorm_QK_pre_rope_enabled:
        q, k = (
            (
                weight.to(torch.float32).reshape(-1)
                * x.to(torch.float32)
                * torch.rsqrt(x.to(torch.float32).pow(2).mean(-1, keepdim=True) + rmsnorm_QK_pre_rope_eps)
            ).to(x.dtype)
            for x, weight in ((q, rmsnorm_QK_pre_rope_W_Q), (k, rmsnorm_QK_pre_rope_W_K))
        )
    if qk_norm is not None:
        q, k = qk_norm(q, k)
    cos = cos.permute(1, 2, 0).reshape(tokens, head_dim // 2)
    sin = sin.permute(1, 2, 0).reshape(tokens, head_dim // 2)
    q, k = apply_rotary_pos_emb(q, k, torch.cat((cos, cos), dim=-1), torch.cat((sin, sin), dim=-1))

    # the new keys and values go to their cache slots
    slots = kv_cache_update_idx.reshape(-1).to(torch.int64)
    blocks = (slots // block_size).repeat(kv_heads)
    offsets = (slots % block_size).repeat(kv_heads)
    heads = torch.arange(kv_heads, device=X.device).repeat_interleave(tokens)
    K_cache.index_put_((blocks, heads, offsets), k.reshape(-1, head_dim).to(K_cache.dtype))
    V_cache.index_put_((blocks, heads, offsets), v.reshape(-1, head_dim).to(V_cache.dtype))

    # each sequence's context from its blocks, the active tokens in the last S slots
    table = active_blocks_table.to(torch.int64)
    context = table.shape[1] * block_size
    k_ctx = K_cache[table].transpose(1, 2).reshape(batch, kv_heads, context, head_dim).to(X.dtype)
    v_ctx = V_cache[table].transpose(1, 2).reshape(batch, kv_heads, context, head_dim).to(X.dtype)
    k_ctx[:, :, context - seq :] = k.reshape(kv_heads, batch, seq, head_dim).transpose(0, 1)
    v_ctx[:, :, context - seq :] = v.reshape(kv_heads, batch, seq, head_dim).transpose(0, 1)
    k_ctx = k_ctx.repeat_interleave(q_heads // kv_heads, dim=1)
    v_ctx = v_ctx.repeat_interleave(q_heads // kv_heads, dim=1)
    q = q.reshape(q_heads, batch, seq, head_dim).transpose(0, 1)

    scores = torch.matmul(q.to(torch.float32), k_ctx.to(torch.float32).transpose(-1, -2)) * softmax_scale
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    visible = attention_mask.permute(1, 2, 3, 0) != 0
    scores = scores.masked_fill(~visible, float("-inf"))
    if sink is not None:
        sink = sink.to(torch.float32).reshape(1, q_heads, 1, 1).expand(batch, q_heads, seq, 1)
        scores = torch.cat((scores, sink), dim=-1)
    probs = torch.softmax(scores, dim=-1)
    if sink is not None:
        probs = probs[..., :-1]
    attn = torch.matmul(probs.to(X.dtype), v_ctx)
    attn = attn.transpose(1, 2).reshape(1, tokens, q_heads * head_dim)
    return NF.o_proj(attn, W_out, bias_out).reshape(tokens, -1)
'''


def to_unfused_decode(call: cst.Call) -> cst.Call:
    """``NF.attention_decode(...)`` -> ``_attention_decode_unfused(...)``, same arguments."""
    if dotted(call.func) == UNFUSED_DECODE_CALL:
        return call
    return call.with_changes(func=cst.Name(UNFUSED_DECODE_CALL))


def parse_method(code: str, module: cst.Module) -> cst.FunctionDef:
    """A method from source written at module level (``def m(self, ...):``):
    parsed inside a class so that multi-line strings keep the method's
    indentation."""
    import textwrap

    indent = module.default_indent
    wrapped = "class _Holder:\n" + textwrap.indent(code.strip("\n") + "\n", indent)
    holder = parse_statement(wrapped, module)
    assert isinstance(holder, cst.ClassDef)
    func = holder.body.body[0]
    assert isinstance(func, cst.FunctionDef), code
    return func


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

PARTIAL_FACTOR_FUNCTION = '''
def _partial_rotary_factor(config) -> float:
    """Fraction of each head that RoPE rotates: the config field, else the value
    in the RoPE parameters, else 1 (the whole head)."""
    if config.partial_rotary_factor is not None:
        return float(config.partial_rotary_factor)
    return float((config.rope_scaling or {}).get("partial_rotary_factor", 1.0))
'''

ROPE_ORDER_COMMENT = (
    "<-- MODEL-SPECIFIC: checkpoint RoPE pairs moved to the pairs (i, i + head_dim / 2) rotated here"
)

# (parameter, width of its query/key part)
ROPE_REORDERED = (
    ("qkv_proj_weight", "self.q_size + self.kv_size"),
    ("qkv_proj_bias", "self.q_size + self.kv_size"),
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


def reorder_rope_columns(
    module: cst.Module,
    ctx: FileContext,
    codemod_id: str,
    rotary_dim: str | None = None,
    interleaved: bool | None = None,
) -> cst.Module:
    """Give every attention class ``self.rope_column_order`` (built with the
    given ``rotary_dim`` expression and/or ``interleaved`` flag, keeping what
    another codemod set) and wrap the loaders of the fused QKV weight and
    bias, and of per-head query/key norms, so that they load reordered."""
    from autoport_cst.transform.cst_helpers import ensure_import_from

    edits: dict = {}
    for cls in attention_classes(module, ctx, codemod_id):
        name = cls.name.value
        init = require_method(cls, "__init__", ctx, module, codemod_id)
        existing = None
        for node in walk(init):
            if isinstance(node, cst.SimpleStatementLine):
                pair = self_assignment(node)
                if pair is not None and pair[0] == "rope_column_order":
                    existing = node
        current_rotary, current_interleaved = "self.head_dim", "False"
        if existing is not None:
            call = self_assignment(existing)[1]
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
        new_interleaved = (
            ("True" if interleaved else "False") if interleaved is not None else current_interleaved
        )
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
        else:
            anchor = None
            for attr in ("qkv_split_indices", "kv_size", "q_size"):
                anchor = next(
                    (s for s in init.body.body if (p := self_assignment(s)) is not None and p[0] == attr),
                    None,
                )
                if anchor is not None:
                    break
            if anchor is None:
                raise ctx.precondition(
                    f"{codemod_id}: {name}.__init__ sets no self.q_size / self.kv_size "
                    "(the widths of the query and key heads)",
                    init,
                    module,
                )
            edits[id(anchor)] = lambda updated, stmt=stmt: cst.FlattenSentinel([updated, stmt])

        # loaders
        loaders: dict[str, cst.SimpleStatementLine] = {}
        wrapped: set[str] = set()
        for node in walk(cls):
            if isinstance(node, cst.SimpleStatementLine) and isinstance(node.body[0], cst.Expr):
                call = node.body[0].value
                if is_call(call, "set_weight_loader") and call.args:
                    target = dotted(call.args[0].value) or ""
                    inner = call.args[1].value if len(call.args) > 1 else None
                    if isinstance(inner, cst.Call) and dotted(inner.func) == "_rope_columns_loader":
                        wrapped.add(target)
                    else:
                        loaders.setdefault(target, node)
        params = self_parameters(cls)
        if "self.qkv_proj_weight" not in loaders and "self.qkv_proj_weight" not in wrapped:
            raise ctx.precondition(
                f"{codemod_id}: {name} attaches no loader to self.qkv_proj_weight "
                "(set_weight_loader(self.qkv_proj_weight, ...))",
                cls,
                module,
            )
        targets = [(f"self.{p}", width) for p, width in ROPE_REORDERED if p in params]
        for norm in ("q_norm", "k_norm"):
            if find_self_assignment_deep(init, norm) is not None:
                width = "self.head_dim"
                if norm_is_full_width(cls, norm):
                    width = "self.q_size" if norm == "q_norm" else "self.kv_size"
                targets.append((f"self.{norm}.weight", width))
        last_anchor = None
        additions = []
        for target, width in targets:
            if target in wrapped:
                continue
            anchor = loaders.get(target)
            wrap = parse_statement(
                f"set_weight_loader(\n"
                f"    {target},\n"
                f"    _rope_columns_loader(get_weight_loader({target}), self.rope_column_order, {width}),\n"
                f")",
                module,
            )
            if anchor is not None:
                edits[id(anchor)] = lambda updated, wrap=wrap: cst.FlattenSentinel([updated, wrap])
                last_anchor = anchor
            else:
                additions.append(wrap)
        if additions:
            # parameters loaded by name (norm gammas): wrap after the last loader
            anchor = last_anchor or loaders.get("self.qkv_proj_weight")
            if anchor is None:
                raise ctx.precondition(
                    f"{codemod_id}: nowhere to attach the reordering loaders in {name}", cls, module
                )
            previous = edits.get(id(anchor))

            def place(updated, previous=previous, additions=additions):
                base = previous(updated) if previous else updated
                nodes = list(base.nodes) if isinstance(base, cst.FlattenSentinel) else [base]
                return cst.FlattenSentinel([*nodes, *additions])

            edits[id(anchor)] = place
    module = rewrite(module, edits)
    module = add_functions(module, [ROPE_ORDER_FUNCTION, ROPE_LOADER_FUNCTION])
    loaders_module = "vllm_neuron.utils.weight_loader"
    for imported in ("SafetensorsWeightLoader", "get_weight_loader", "set_weight_loader"):
        module = ensure_import_from(module, loaders_module, imported)
    return module


def find_self_assignment_deep(func: cst.FunctionDef, attr: str):
    for node in walk(func):
        if isinstance(node, cst.SimpleStatementLine):
            pair = self_assignment(node)
            if pair is not None and pair[0] == attr:
                return node
    return None


def norm_is_full_width(cls: cst.ClassDef, norm: str) -> bool:
    """Whether ``self.<norm>`` is built over all heads (``self.q_size`` /
    ``self.kv_size`` wide) rather than one head."""
    for node in walk(cls):
        if isinstance(node, cst.SimpleStatementLine):
            pair = self_assignment(node)
            if pair is not None and pair[0] == norm and isinstance(pair[1], cst.Call) and pair[1].args:
                return dotted(pair[1].args[0].value) in ("self.q_size", "self.kv_size")
    return False


# -- prefill attention computed op by op ------------------------------------------------

UNFUSED_PREFILL_CALL = "_flash_attention_unfused"

PREFILL_UNFUSED = '''
def _flash_attention_unfused(
    q,
    k,
    v,
    scale=None,
    causal_mask=True,
    sink=None,
    sliding_window=None,
    tp_q=True,
    tp_k=False,
    tp_out=False,
    softcap=None,
):
    """NF.flash_attention computed op by op, for what the kernel cannot do:
    ``softcap`` (tanh softcapping of the attention scores, before the mask).

    Same arguments and layouts as the kernel: q [B, S, D] with ``tp_q``, else
    [B, D, S]; k [B, S, D] with ``tp_k``, else [B, D, S]; v [B, S, D]; B may
    be heads (GQA when q has a multiple of k's). Returns [B, D, S] with
    ``tp_out``, else [B, S, D].
    """
    q = q if tp_q else q.transpose(1, 2)
    k = k if tp_k else k.transpose(1, 2)
    if q.shape[0] != k.shape[0]:
        k = k.repeat_interleave(q.shape[0] // k.shape[0], dim=0)
        v = v.repeat_interleave(q.shape[0] // v.shape[0], dim=0)
    seq_q, seq_k = q.shape[1], k.shape[1]
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = torch.matmul(q.to(torch.float32), k.to(torch.float32).transpose(-1, -2)) * scale
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    q_pos = torch.arange(seq_q, device=q.device).unsqueeze(1) + (seq_k - seq_q)
    k_pos = torch.arange(seq_k, device=q.device).unsqueeze(0)
    visible = torch.ones(seq_q, seq_k, dtype=torch.bool, device=q.device)
    if causal_mask:
        visible = visible & (k_pos <= q_pos)
    if sliding_window is not None:
        visible = visible & (q_pos < k_pos + sliding_window)
    scores = scores.masked_fill(~visible, float("-inf"))
    if sink is not None:
        sink = sink.to(torch.float32).reshape(-1, 1, 1).expand(scores.shape[0], seq_q, 1)
        scores = torch.cat((scores, sink), dim=-1)
    probs = torch.softmax(scores, dim=-1)
    if sink is not None:
        probs = probs[..., :-1]
    output = torch.matmul(probs.to(v.dtype), v)
    return output.transpose(1, 2) if tp_out else output
'''


def to_unfused_prefill(call: cst.Call) -> cst.Call:
    """``NF.flash_attention(...)`` -> ``_flash_attention_unfused(...)``, same arguments."""
    if dotted(call.func) == UNFUSED_PREFILL_CALL:
        return call
    return call.with_changes(func=cst.Name(UNFUSED_PREFILL_CALL))
