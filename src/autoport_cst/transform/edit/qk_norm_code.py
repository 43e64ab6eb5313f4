"""The code qk-norm writes into an attention class: full-width query and
key norms (RMSNorm over all heads, sharded by head like the projection) with
their loaders and the methods computing them across TP ranks, and the
arguments that turn on the kernels' own per-head pre-RoPE q/k norm (the
prefill ``NF.qkv_proj`` and the decode kernel)."""

from __future__ import annotations

import libcst as cst

from autoport_cst.transform.cst.snippets import parse_expr
from autoport_cst.transform.edit.arguments import set_keyword

# full-width norms, sharded by head like the projection (TP ranks; a KV head
# held by several ranks is loaded by each of them)
FULL_WIDTH_NORMS = """\
self.q_norm = {norm}(self.q_size, {eps}, {dtype})
self.k_norm = {norm}(self.kv_size, {eps}, {dtype})
set_weight_loader(
    self.q_norm.weight,
    sharding_weight_loader(shard_dim=0, shard_size=self.q_size, num_shards=self.world_size),
)
set_weight_loader(
    self.k_norm.weight,
    with_rank_override(
        sharding_weight_loader(
            shard_dim=0,
            shard_size=self.kv_size,
            num_shards=self.num_key_value_heads // self.num_key_value_heads_per_rank,
        ),
        self.rank // self.num_kv_replicas,
    ),
)
"""
# the attributes the full-width norms, their loaders and _full_width_rms_norm read
FULL_WIDTH_READS = (
    "q_size",
    "kv_size",
    "world_size",
    "rank",
    "num_key_value_heads",
    "num_key_value_heads_per_rank",
    "num_kv_replicas",
    "tp_group",
)
# the kernel's pre-RoPE q/k norm of NF.qkv_proj, per head
PREFILL_NORM_ARGS = (
    ("qk_norm_pre_rope_q_norm", "NormType.RMS_NORM"),
    ("qk_norm_pre_rope_k_norm", "NormType.RMS_NORM"),
    ("qk_norm_pre_rope_eps", "self.q_norm.{eps}"),
    ("qk_norm_pre_rope_q_gamma", "self.q_norm.weight.view(1, -1)"),
    ("qk_norm_pre_rope_k_gamma", "self.k_norm.weight.view(1, -1)"),
)

# the decode kernel's pre-RoPE q/k norm, per head
DECODE_NORM_ARGS = (
    ("rmsnorm_QK_pre_rope_enabled", "True"),
    ("rmsnorm_QK_pre_rope_eps", "self.q_norm.{eps}"),
    ("rmsnorm_QK_pre_rope_W_Q", "self.q_norm.weight.view(1, -1)"),
    ("rmsnorm_QK_pre_rope_W_K", "self.k_norm.weight.view(1, -1)"),
)

FULL_WIDTH_METHOD = '''
def _full_width_qk_norm(self, q, k):
    """RMSNorm over all query heads together, and over all key heads together
    (the norm spans the whole projection width, not one head).

    q: [Nq, T, Dh] and k: [Nkv, T, Dh] are this rank's heads; the mean square
    sums over the heads of every rank (a KV head held by several ranks is
    counted once), and each rank applies the weights of its own heads.
    """
    return (
        self._full_width_rms_norm(q, self.q_norm, 1),
        self._full_width_rms_norm(k, self.k_norm, self.num_kv_replicas),
    )
'''

FULL_WIDTH_NORM = '''
def _full_width_rms_norm(self, x, norm, replicas):
    """RMSNorm of x ([N, T, Dh], this rank's N heads) over the heads of all
    ranks, in float32; ``replicas`` ranks hold each of these heads."""
    dtype = x.dtype
    x = x.to(torch.float32)
    square_sum = x.pow(2).sum(dim=(0, 2), keepdim=True)  # [1, T, 1]
    width = x.shape[0] * x.shape[2]
    # >>> PARALLELISM: sum the squares of every rank's heads <<<
    if self.world_size > 1:
        square_sum = self.tp_group.all_reduce(square_sum) / replicas
        width = width * self.world_size // replicas
    x = x * torch.rsqrt(square_sum / width + norm.variance_epsilon)
    weight = norm.weight.to(torch.float32).view(x.shape[0], 1, x.shape[2])
    return (weight * x).to(dtype)
'''


def has_post_rope_norm(call: cst.Call) -> bool:
    """Whether a kernel call already applies its per-head q/k norm after RoPE
    (``qk_norm_post_rope_*`` of ``NF.qkv_proj``, ``rmsnorm_QK_post_rope_enabled=True``
    of the decode kernel): the norms are there, at the position qk-norm-position chose."""
    for arg in call.args:
        if arg.keyword is None:
            continue
        name = arg.keyword.value
        if name.startswith("qk_norm_post_rope_"):
            return True
        if name == "rmsnorm_QK_post_rope_enabled":
            return isinstance(arg.value, cst.Name) and arg.value.value == "True"
    return False


def prefill_norm_args(call: cst.Call, eps_attr: str, module: cst.Module) -> cst.Call:
    """``NF.qkv_proj(...)`` with the kernel's per-head pre-RoPE q/k norm."""
    previous: tuple[str, ...] = ()
    for key, code in PREFILL_NORM_ARGS:
        call = set_keyword(call, key, parse_expr(code.format(eps=eps_attr), module), after=previous)
        previous = (key,)
    return call


def decode_norm_args(call: cst.Call, eps_attr: str, module: cst.Module) -> cst.Call:
    """The decode kernel call with its per-head pre-RoPE q/k norm on."""
    previous: tuple[str, ...] = ()
    for key, code in DECODE_NORM_ARGS:
        call = set_keyword(call, key, parse_expr(code.format(eps=eps_attr), module), after=previous)
        previous = (key,)
    return call
