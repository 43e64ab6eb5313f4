"""Guards and op-by-op substitutes of the attention kernels of a model file
(the kernel sites, path by path, are found by
``autoport_cst.transform.anatomy.attention``).

A codemod that changes what attention computes edits every kernel site, or
guards the ones whose kernel cannot express the change: :func:`guard` makes
a path raise ``NotImplementedError`` naming the feature.

The substitutes compute a kernel op by op for what no kernel does (softcap,
a norm over all heads): same arguments, layouts and numerics as the kernel
(``autoport_cst.validate.standin`` follows the real kernels), every argument
implemented or refused by name when set.
"""

from __future__ import annotations

from typing import cast

import libcst as cst

from autoport_cst.transform import FileContext
from autoport_cst.transform.anatomy.attention import (
    DECODE,
    FLASH,
    SEGMENTED,
    UNFUSED_DECODE_CALL,
    UNFUSED_PREFILL_CALL,
    UNFUSED_SEGMENTED_CALL,
    KernelSite,
)
from autoport_cst.transform.cst.snippets import parse_statement
from autoport_cst.transform.cst.vocabulary import (
    deep_statements,
    dotted,
    keyword_arg,
    nodes_of,
    walk,
)
from autoport_cst.transform.edit.tree import with_comment

# -- guards ---------------------------------------------------------------------------------


def innermost_statement(func: cst.FunctionDef, target: cst.CSTNode) -> cst.BaseStatement | None:
    """The innermost statement of ``func`` (at any depth) that holds ``target``."""
    found = None
    for stmt in deep_statements(func):
        if any(n is target for n in walk(stmt)):
            found = stmt
    return found


def insert_before(edits: dict, holder: cst.BaseStatement, new: list[cst.BaseStatement]) -> None:
    """Record the insertion of ``new`` right before ``holder`` (in its block),
    after what earlier insertions put there; the comment lines above
    ``holder`` move above the first inserted statement."""
    previous = edits.get(id(holder))

    def place(updated, previous=previous, new=new):
        base = previous(updated) if previous is not None else updated
        nodes = list(base.nodes) if isinstance(base, cst.FlattenSentinel) else [base]
        *before, last = nodes
        if not before:
            first = new[0].with_changes(leading_lines=[*last.leading_lines, *new[0].leading_lines])
            return cst.FlattenSentinel([first, *new[1:], last.with_changes(leading_lines=[])])
        return cst.FlattenSentinel([*before, *new, last])

    edits[id(holder)] = place


def guard(
    module: cst.Module,
    ctx: FileContext,
    site: KernelSite,
    condition: str,
    message: str,
    edits: dict,
    comment: str,
) -> None:
    """Make ``site``'s path raise ``NotImplementedError(message)`` when
    ``condition`` holds, right before the statement that runs the kernel, and
    declare the site handled that way."""
    ctx.unaffected(site.call, f"guarded: {message}")
    guard_statement(module, ctx, site.method, site.call, condition, message, edits, comment)


def guard_statement(
    module: cst.Module,
    ctx: FileContext,
    func: cst.FunctionDef,
    target: cst.CSTNode,
    condition: str,
    message: str,
    edits: dict,
    comment: str,
) -> None:
    """Raise ``NotImplementedError(message)`` when ``condition`` holds, right
    before the statement of ``func`` that holds ``target`` (once: a method
    that already raises this message is left as it is)."""
    text = message.replace("\\", "\\\\").replace('"', '\\"')
    if any(n.value == f'"{text}"' for n in cast(list[cst.SimpleString], nodes_of(func, cst.SimpleString))):
        return
    holder = innermost_statement(func, target)
    if holder is None:  # pragma: no cover - a call always sits in a statement
        raise ctx.refuse("cannot place a guard before this call", target, module)
    stmt = parse_statement(
        f'if {condition}:\n    raise NotImplementedError(\n        "{text}"\n    )', module
    )
    insert_before(edits, holder, [with_comment(stmt, comment)])


def argument(call: cst.Call, name: str, position: int | None = None) -> cst.BaseExpression | None:
    """The value passed to parameter ``name`` (by keyword, or at ``position``)."""
    arg = keyword_arg(call, name)
    if arg is not None:
        return arg.value
    positional = [a for a in call.args if a.keyword is None and not a.star]
    if position is not None and position < len(positional):
        return positional[position].value
    return None


# -- substitutes ----------------------------------------------------------------------------


def to_unfused(call: cst.Call, kind: str) -> cst.Call:
    """The kernel call ``call`` of ``kind`` made a call of its substitute
    (same arguments)."""
    name = {FLASH: UNFUSED_PREFILL_CALL, SEGMENTED: UNFUSED_SEGMENTED_CALL, DECODE: UNFUSED_DECODE_CALL}[kind]
    if dotted(call.func) == name:
        return call
    return call.with_changes(func=cst.Name(name))


def to_unfused_decode(call: cst.Call) -> cst.Call:
    """``NF.attention_decode(...)`` -> ``_attention_decode_unfused(...)``, same arguments."""
    return to_unfused(call, DECODE)


def to_unfused_prefill(call: cst.Call) -> cst.Call:
    """``NF.flash_attention(...)`` -> ``_flash_attention_unfused(...)``, same arguments."""
    return to_unfused(call, FLASH)


def to_unfused_segmented(call: cst.Call) -> cst.Call:
    """``NF.segmented_attention(...)`` -> ``_segmented_attention_unfused(...)``, same arguments."""
    return to_unfused(call, SEGMENTED)


DECODE_UNFUSED = '''
def _attention_decode_unfused(
    X,
    X_hidden_dim_actual=None,
    rmsnorm_X_enabled=False,
    rmsnorm_X_eps=None,
    rmsnorm_X_gamma=None,
    W_qkv=None,
    bias_qkv=None,
    rmsnorm_QK_pre_rope_enabled=False,
    rmsnorm_QK_pre_rope_eps=1e-6,
    rmsnorm_QK_pre_rope_W_Q=None,
    rmsnorm_QK_pre_rope_W_K=None,
    cos=None,
    sin=None,
    rope_contiguous_layout=True,
    rmsnorm_QK_post_rope_enabled=False,
    rmsnorm_QK_post_rope_eps=1e-6,
    rmsnorm_QK_post_rope_W_Q=None,
    rmsnorm_QK_post_rope_W_K=None,
    active_blocks_table=None,
    K_cache=None,
    V_cache=None,
    attention_mask=None,
    sink=None,
    softmax_scale=None,
    pos_ids=None,
    swa_start_pos_ids=None,
    max_context_len=None,
    update_cache=False,
    kv_cache_update_idx=None,
    k_scale=None,
    v_scale=None,
    fp8_packed=False,
    W_out=None,
    bias_out=None,
    attention_dp=1,
    attention_dp_group=None,
    attention_dp_rank=0,
    kv_needs_a2a=False,
    dcp_size=1,
    dcp_group=None,
    qk_norm=None,
    softcap=None,
    q_scale=None,
    alibi_slopes=None,
    alibi_positions=None,
    **kernel_options,
):
    """NF.attention_decode computed op by op, for what the fused decode kernel
    cannot do: ``qk_norm`` (a function of q [Nq, T, Dh] and k [Nkv, T, Dh]
    applied before RoPE, such as a norm over all heads), ``softcap`` (tanh
    softcapping of the attention scores, before the mask) and ``q_scale`` (a
    factor per token [B * S], multiplying the rotated queries: an attention
    temperature; the product in the factor's dtype, rounded to the queries') and
    ``alibi_slopes`` (ALiBi: a slope per query head [Nq] in float32, each score
    plus slope * (key position - query position), after the scale; prior slot s
    holds position s, the step's tokens are at ``alibi_positions`` [B * S], or
    at ``pos_ids`` when that is given).

    The kernel's arguments, layouts and results: X [B, S, H]; caches
    [blocks, Nkv, block, Dh] or [blocks, block, Dh] (one KV head); cos/sin
    [Dh/2, B, S]; the mask [context, B, Nq, S] whose last S slots are the
    step's tokens, or built from ``pos_ids`` (and ``swa_start_pos_ids``);
    ``max_context_len`` bounds the prior slots read. With ``update_cache`` the
    step's K/V go to the slots ``kv_cache_update_idx`` [B, S] (slots outside
    the cache skipped) and the output [B * S, H] is returned; without, the
    output, K [Dh, B * Nkv, S] and V [B, Nkv, S, Dh]. With ``k_scale`` and
    ``v_scale`` (an FP8 cache) the step's K/V are stored as ``x * scale``,
    clamped to the platform's FP8 range, in the cache's FP8 format, and the
    cache is read raw (the dequantization is the caller's, folded into
    ``softmax_scale`` and ``W_out``). Decode context
    parallelism (``dcp_size`` W over ``dcp_group``) as the kernel does it: each
    rank holds an interleaved share of the context, the rotated queries of the
    group's heads are gathered (the mask is for W times the local heads), each
    rank attends over its share and the partial outputs are merged by their
    log-sum-exp and scattered back by head; with it, ``sink``, ``alibi_slopes``,
    ``pos_ids`` and ``max_context_len`` are refused by name. The packed FP8 K
    cache, attention data parallelism and the kernel's other options are
    refused by name.
    """
    refused = [
        name
        for name, value in kernel_options.items()
        if not name.startswith("sbm_") and value is not None and value is not False
    ]
    refused += [name for name, value in (("fp8_packed", fp8_packed), ("kv_needs_a2a", kv_needs_a2a)) if value]
    if attention_dp != 1:
        refused.append(f"attention_dp={attention_dp}")
    if dcp_size != 1:
        context_parallel_refused = (
            ("sink", sink), ("alibi_slopes", alibi_slopes), ("pos_ids", pos_ids), ("max_context_len", max_context_len)
        )
        refused += [f"{name} with dcp_size={dcp_size}" for name, value in context_parallel_refused if value is not None]
    if refused:
        raise NotImplementedError(f"the op-by-op decode attention does not implement {', '.join(refused)}")
    if dcp_size != 1 and (dcp_group is None or dcp_group.world_size != dcp_size):
        raise ValueError(f"dcp_size={dcp_size} needs a dcp_group of that size")
    if (k_scale is None) != (v_scale is None):
        raise ValueError("k_scale and v_scale go together")

    def rms_norm(x, eps, weight, width=None):
        x32 = x.to(torch.float32)
        square = x32.pow(2).mean(-1, keepdim=True) if width in (None, x32.shape[-1]) else x32.pow(2).sum(-1, keepdim=True) / width
        x32 = x32 * torch.rsqrt(square + eps)
        return (x32 if weight is None else x32 * weight.to(torch.float32).reshape(-1)).to(x.dtype)

    batch, seq, _ = X.shape
    cache_view = V_cache if V_cache.dim() == 4 else V_cache.unsqueeze(1)
    _, kv_heads, block_size, head_dim = cache_view.shape
    x = X
    if rmsnorm_X_enabled:
        x = rms_norm(x, 1e-3 if rmsnorm_X_eps is None else rmsnorm_X_eps, rmsnorm_X_gamma, X_hidden_dim_actual)
    qkv = NF.qkv_proj(hidden=x, qkv_weights=W_qkv, bias=bias_qkv).reshape(batch, seq, -1)
    q_heads = qkv.shape[-1] // head_dim - 2 * kv_heads
    q_end, k_end = q_heads * head_dim, (q_heads + kv_heads) * head_dim
    q = qkv[..., :q_end].reshape(batch, seq, q_heads, head_dim).transpose(1, 2)
    k = qkv[..., q_end:k_end].reshape(batch, seq, kv_heads, head_dim).transpose(1, 2)
    v = qkv[..., k_end:].reshape(batch, seq, kv_heads, head_dim).transpose(1, 2)
    if rmsnorm_QK_pre_rope_enabled:
        q = rms_norm(q, rmsnorm_QK_pre_rope_eps, rmsnorm_QK_pre_rope_W_Q)
        k = rms_norm(k, rmsnorm_QK_pre_rope_eps, rmsnorm_QK_pre_rope_W_K)
    if qk_norm is not None:
        q, k = qk_norm(
            q.transpose(0, 1).reshape(q_heads, batch * seq, head_dim),
            k.transpose(0, 1).reshape(kv_heads, batch * seq, head_dim),
        )
        q = q.reshape(q_heads, batch, seq, head_dim).transpose(0, 1)
        k = k.reshape(kv_heads, batch, seq, head_dim).transpose(0, 1)
    if cos is not None and sin is not None:
        cos = cos.permute(1, 2, 0).unsqueeze(1).to(q.dtype)
        sin = sin.permute(1, 2, 0).unsqueeze(1).to(q.dtype)
        if rope_contiguous_layout:
            cos, sin = torch.cat((cos, cos), dim=-1), torch.cat((sin, sin), dim=-1)
            half = head_dim // 2
            rotate = lambda t: torch.cat((-t[..., half:], t[..., :half]), dim=-1)  # noqa: E731
        else:
            cos, sin = torch.stack((cos, cos), dim=-1).flatten(-2), torch.stack((sin, sin), dim=-1).flatten(-2)
            rotate = lambda t: torch.stack((-t[..., 1::2], t[..., 0::2]), dim=-1).flatten(-2)  # noqa: E731
        q, k = q * cos + rotate(q) * sin, k * cos + rotate(k) * sin
    if rmsnorm_QK_post_rope_enabled:
        q = rms_norm(q, rmsnorm_QK_post_rope_eps, rmsnorm_QK_post_rope_W_Q)
        k = rms_norm(k, rmsnorm_QK_post_rope_eps, rmsnorm_QK_post_rope_W_K)
    if q_scale is not None:
        q = (q * q_scale.reshape(batch, 1, seq, 1)).to(q.dtype)
    if k_scale is not None:  # an FP8 cache: the step's K/V stored as x * scale in the cache's format
        from vllm_neuron.utils.dtype_utils import FP8_CLAMP_MAX

        def stored(x, scale, cache):
            fp8 = cache.dtype if cache.dtype in (torch.float8_e4m3fn, torch.float8_e5m2) else torch.float8_e4m3fn
            scaled = x.to(torch.float32) * scale.to(torch.float32).reshape(-1)[0]
            return scaled.clamp(-FP8_CLAMP_MAX, FP8_CLAMP_MAX).to(fp8)

        k, v = stored(k, k_scale, K_cache), stored(v, v_scale, V_cache)
    if dcp_size > 1:
        q = dcp_group.all_gather(q.contiguous(), dim=1)  # the group's heads, this rank's share of the context

    # each sequence's context from its blocks, the step's tokens in the last S slots
    table = active_blocks_table.to(torch.int64).clamp(min=0)
    blocks_per_seq = table.shape[-1]
    context = blocks_per_seq * block_size

    def gathered(cache):
        view = cache if cache.dim() == 4 else cache.unsqueeze(1)
        rows = view[table.reshape(-1)].to(X.dtype)
        rows = rows.view(batch, blocks_per_seq, kv_heads, block_size, head_dim).permute(0, 2, 1, 3, 4)
        return rows.reshape(batch, kv_heads, context, head_dim)

    k_ctx, v_ctx = gathered(K_cache), gathered(V_cache)
    k_ctx[:, :, context - seq :] = k.to(X.dtype)
    v_ctx[:, :, context - seq :] = v.to(X.dtype)
    if pos_ids is not None:
        start = None if swa_start_pos_ids is None else swa_start_pos_ids.reshape(1, -1).to(torch.float32)
        attention_mask = NF.gen_attention_decode_mask(
            pos_ids=pos_ids.reshape(1, -1).to(torch.float32),
            bs=batch,
            q_head=q_heads,
            s_active=seq,
            s_prior=context,
            start_pos=start,
            block_len=block_size,
        )
    elif swa_start_pos_ids is not None:
        raise ValueError("swa_start_pos_ids needs pos_ids")
    visible = attention_mask.permute(1, 2, 3, 0) != 0  # [B, Nq, S, context]
    if max_context_len is not None:
        slots = torch.arange(context, device=X.device)
        limit = max_context_len.reshape(-1)[0].to(torch.int64)
        visible = visible & ((slots < limit) | (slots >= context - seq))

    groups = q.shape[1] // kv_heads
    keys = k_ctx.repeat_interleave(groups, dim=1).to(torch.float32)
    values = v_ctx.repeat_interleave(groups, dim=1).to(torch.float32)
    scale = head_dim**-0.5 if softmax_scale is None else softmax_scale
    scores = torch.matmul(q.to(torch.float32), keys.transpose(-1, -2)) * scale
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if alibi_slopes is not None:
        step_pos = alibi_positions if pos_ids is None else pos_ids
        if step_pos is None:
            raise ValueError("ALiBi decode needs the positions of the step's tokens (alibi_positions or pos_ids)")
        q_pos = step_pos.reshape(batch, seq).to(torch.float32)
        k_pos = torch.arange(context, device=X.device, dtype=torch.float32).expand(batch, context).clone()
        k_pos[:, context - seq :] = q_pos
        distance = (k_pos[:, None, :] - q_pos[:, :, None]).unsqueeze(1)  # [B, 1, S, context]
        slopes = alibi_slopes.to(torch.float32).reshape(1, q_heads, 1, 1)
        scores = scores + slopes * distance
    scores = scores.masked_fill(~visible, float("-inf"))
    if sink is not None:
        column = sink.to(torch.float32).reshape(1, q_heads, 1, 1).expand(batch, q_heads, seq, 1)
        scores = torch.cat((scores, column), dim=-1)
    probs = torch.softmax(scores, dim=-1)
    if sink is not None:
        probs = probs[..., :-1]
    attn = torch.matmul(probs.to(X.dtype).to(torch.float32), values).to(X.dtype)  # [B, Nq, S, Dh]
    if dcp_size > 1:
        lse = torch.logsumexp(scores, dim=-1)
        every = dcp_group.all_gather(lse.contiguous(), dim=0).view(dcp_size, *lse.shape)
        weight = torch.exp(lse - torch.logsumexp(every, dim=0)).unsqueeze(-1)
        attn = dcp_group.reduce_scatter((attn.to(torch.float32) * weight).to(X.dtype).contiguous(), dim=1)

    if update_cache:
        slots = kv_cache_update_idx.to(torch.int64).reshape(-1)
        keep = ((slots >= 0) & (slots < cache_view.shape[0] * block_size)).repeat(kv_heads)
        blocks, offsets = (slots // block_size).repeat(kv_heads)[keep], (slots % block_size).repeat(kv_heads)[keep]
        heads = torch.arange(kv_heads, device=X.device).repeat_interleave(slots.shape[0])[keep]
        for cache, new in ((K_cache, k), (V_cache, v)):
            view = cache if cache.dim() == 4 else cache.unsqueeze(1)
            rows = new.transpose(0, 1).reshape(-1, head_dim)[keep]  # head-major, then the tokens
            view.index_put_((blocks, heads, offsets), rows.to(cache.dtype))
    if W_out is None:
        output = attn.transpose(2, 3).contiguous()  # [B, Nq, Dh, S]
    else:
        flat = attn.transpose(1, 2).reshape(1, batch * seq, q_heads * head_dim)
        output = NF.o_proj(flat, W_out, bias_out).reshape(batch * seq, -1)
    if update_cache:
        return output
    return output, k.reshape(batch * kv_heads, seq, head_dim).permute(2, 0, 1).contiguous(), v
'''

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
    alibi_slopes=None,
    **kernel_options,
):
    """NF.flash_attention computed op by op, for what the kernel cannot do:
    ``softcap`` (tanh softcapping of the attention scores, before the mask)
    and ``alibi_slopes`` (ALiBi: one slope per row of q's first dimension,
    each score plus slope * (key position - query position), after the scale).

    Same arguments and layouts as the kernel: q [B, S, D] with ``tp_q``, else
    [B, D, S]; k [B, S, D] with ``tp_k``, else [B, D, S]; v [B, S, D]; B may
    be heads (GQA when q has a multiple of k's). Returns [B, D, S] with
    ``tp_out``, else [B, S, D]. The kernel's other options are refused by name.
    """
    refused = [name for name, value in kernel_options.items() if value is not None and value is not False]
    if refused:
        raise NotImplementedError(f"the op-by-op prefill attention does not implement {', '.join(refused)}")
    q = q if tp_q else q.transpose(1, 2)
    k = k if tp_k else k.transpose(1, 2)
    if q.shape[0] != k.shape[0]:
        k = k.repeat_interleave(q.shape[0] // k.shape[0], dim=0)
        v = v.repeat_interleave(q.shape[0] // v.shape[0], dim=0)
    seq_q, seq_k = q.shape[1], k.shape[1]
    q_pos = torch.arange(seq_q, device=q.device).unsqueeze(1) + (seq_k - seq_q)
    k_pos = torch.arange(seq_k, device=q.device).unsqueeze(0)
    visible = torch.ones(seq_q, seq_k, dtype=torch.bool, device=q.device)
    if causal_mask:
        visible = visible & (k_pos <= q_pos)
    if sliding_window:
        visible = visible & (q_pos < k_pos + sliding_window)
    bias = None if alibi_slopes is None else _alibi_bias(alibi_slopes, q.shape[0], k_pos - q_pos)
    return _softmax_attention(
        q, k, v, q.shape[-1] ** -0.5 if scale is None else scale, visible, sink, softcap, tp_out, bias
    )
'''

SEGMENTED_UNFUSED = '''
def _segmented_attention_unfused(
    q,
    k_cache,
    v_cache,
    block_tables,
    prior_tokens,
    block_size,
    kv_segment_size,
    scale=None,
    tp_q=True,
    tp_out=False,
    sliding_window=None,
    sink=None,
    fp8_packed=False,
    k_scale=None,
    v_scale=None,
    softcap=None,
    alibi_slopes=None,
):
    """NF.segmented_attention computed op by op, for what the kernel cannot
    do: ``softcap`` (tanh softcapping of the attention scores, before the mask)
    and ``alibi_slopes`` (ALiBi: a slope per query head, each score plus
    slope * (cache position - query position), after the scale).

    One chunk of one sequence attends to the sequence's cached tokens (the
    chunk's own K/V already written): query i sees cache positions
    p <= prior_tokens + i (and p > prior_tokens + i - sliding_window).
    q [Nq, S, D] with ``tp_q``, else [Nq, D, S]; caches [blocks, Nkv, block,
    D] or [blocks, block, D]; block_tables [1, max_blocks]. Returns [Nq, D, S]
    with ``tp_out``, else [Nq, S, D]. FP8 cache options are refused by name.
    """
    refused = [
        name for name, value in (("fp8_packed", fp8_packed), ("k_scale", k_scale), ("v_scale", v_scale)) if value
        is not None and value is not False
    ]
    if refused:
        raise NotImplementedError(f"the op-by-op segmented attention does not implement {', '.join(refused)}")
    q = q if tp_q else q.transpose(1, 2)
    heads, q_len, _ = q.shape
    prior = prior_tokens.reshape(-1)[0].to(torch.int64) if isinstance(prior_tokens, torch.Tensor) else prior_tokens
    table = block_tables[0].to(torch.int64).clamp(min=0)

    def gathered(cache):
        view = cache if cache.dim() == 4 else cache.unsqueeze(1)
        rows = view[table].to(q.dtype)  # [blocks, Nkv, block, D]
        return rows.permute(1, 0, 2, 3).reshape(rows.shape[1], -1, rows.shape[3])

    k, v = gathered(k_cache), gathered(v_cache)
    k = k.repeat_interleave(heads // k.shape[0], dim=0)
    v = v.repeat_interleave(heads // v.shape[0], dim=0)
    q_pos = torch.arange(q_len, device=q.device).unsqueeze(1) + prior
    k_pos = torch.arange(k.shape[1], device=q.device).unsqueeze(0)
    visible = (k_pos <= q_pos) & (k_pos < prior + q_len)
    if sliding_window:
        visible = visible & (k_pos > q_pos - sliding_window)
    bias = None if alibi_slopes is None else _alibi_bias(alibi_slopes, heads, k_pos - q_pos)
    return _softmax_attention(
        q, k, v, q.shape[-1] ** -0.5 if scale is None else scale, visible, sink, softcap, tp_out, bias
    )
'''

SOFTMAX_ATTENTION = '''
def _softmax_attention(q, k, v, scale, visible, sink, softcap, tp_out, bias=None):
    """Attention of q [N, Sq, D] over k, v [N, Sk, D] where ``visible``
    [Sq, Sk] allows, as the prefill kernels compute it: scores and softmax in
    float32 (softcapped, plus ``bias`` [N, Sq, Sk] when given, then masked; a
    sink logit per head as one more column), probabilities rounded to v's
    dtype; a query that sees nothing gets zeros. Returns [N, D, Sq] with
    ``tp_out``, else [N, Sq, D]."""
    scores = torch.matmul(q.to(torch.float32), k.to(torch.float32).transpose(-1, -2)) * scale
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if bias is not None:
        scores = scores + bias
    scores = scores.masked_fill(~visible, float("-inf"))
    if sink is not None:
        column = sink.to(torch.float32).reshape(-1, 1, 1).expand(scores.shape[0], scores.shape[1], 1)
        scores = torch.cat((scores, column), dim=-1)
    probs = torch.nan_to_num(torch.softmax(scores, dim=-1), nan=0.0)
    if sink is not None:
        probs = probs[..., :-1]
    output = torch.matmul(probs.to(v.dtype).to(torch.float32), v.to(torch.float32)).to(v.dtype)
    return output.transpose(1, 2) if tp_out else output
'''

# the prefill substitutes call it only when given ALiBi slopes (alibi-positions adds it)
ALIBI_BIAS = '''
def _alibi_bias(slopes, rows, distance):
    """The ALiBi bias [rows, Sq, Sk] in float32: slope * distance (key
    position - query position, [Sq, Sk]) for each of the ``rows`` heads."""
    slopes = slopes.to(torch.float32).reshape(-1)
    if slopes.shape[0] != rows:
        raise ValueError(f"ALiBi: {slopes.shape[0]} slopes for {rows} query heads")
    return slopes.reshape(-1, 1, 1) * distance.to(torch.float32).unsqueeze(0)
'''


def substitutes_for(kinds: set[str]) -> list[str]:
    """Source of the substitute functions that calls of ``kinds`` need."""
    found = []
    if DECODE in kinds:
        found.append(DECODE_UNFUSED)
    if FLASH in kinds:
        found.append(PREFILL_UNFUSED)
    if SEGMENTED in kinds:
        found.append(SEGMENTED_UNFUSED)
    if kinds & {FLASH, SEGMENTED}:
        found.append(SOFTMAX_ATTENTION)
    return found
