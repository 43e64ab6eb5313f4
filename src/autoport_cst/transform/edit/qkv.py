"""Code written beside the query/key/value projection: the data-parallel bias
loader, the unfused prefill projection and the partial rotary factor read from
the config."""

from __future__ import annotations

import libcst as cst

from autoport_cst.transform.anatomy.qkv import rope_dict_attribute

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

PARTIAL_FACTOR_TEMPLATE = '''
def _partial_rotary_factor(config) -> float:
    """Fraction of each head that RoPE rotates: the config field, else the value
    in the RoPE parameters, else 1 (the whole head)."""
    if config.partial_rotary_factor is not None:
        return float(config.partial_rotary_factor)
    return float((config.{rope_dict} or {{}}).get("partial_rotary_factor", 1.0))
'''


def partial_factor_function(module: cst.Module) -> str:
    """``_partial_rotary_factor`` reading the RoPE parameters where this
    model file's config keeps them (``rope_parameters`` when it reads
    neither: the config codemod then adds that field)."""
    return PARTIAL_FACTOR_TEMPLATE.format(rope_dict=rope_dict_attribute(module) or "rope_parameters")
