"""interleaved-rope: RoPE on adjacent pairs (2j, 2j + 1) (GPT-J / Cohere / GLM style)."""

from __future__ import annotations

import libcst as cst

from autoport_cst.spec.pitfalls import Pitfall
from autoport_cst.transform import Codemod, Example, FileContext, NoParams, PortContext
from autoport_cst.transform.edit.rope_columns import reorder_rope_columns
from autoport_cst.transform.realizes import Realizes, to

ID = "interleaved-rope"


class InterleavedRope(Codemod):
    """Interleaved RoPE: adjacent pairs ``(2j, 2j + 1)`` of each head rotate together.

    The checkpoint's model rotates pairs ``(2j, 2j + 1)`` of each query and
    key head instead of the halves ``(j, j + d/2)``.

    The prefill RoPE (``_apply_rotary_emb``) and the decode kernel both
    rotate halves, and the kernel has no interleaved mode on device. Rather
    than change either path, the attention class loads the query and key
    columns of each head reordered (``_rope_column_order(...,
    interleaved=True)``, ``_rope_columns_loader`` around the loaders of the
    fused QKV weight, its bias and per-head query/key norm gammas): checkpoint
    column ``2j`` goes to ``j`` and ``2j + 1`` to ``j + d/2``, so that the
    pair rotated by frequency ``j`` is the same on both sides. Queries and
    keys are reordered alike, so attention scores do not change; the cos/sin
    tables, values and the output projection stay as they are. With
    ``partial-rotary`` the same order also moves the pass-through columns.

    Every loader of a tensor laid out in query/key head columns is wrapped
    where it is attached, however it is built (a local bound to the loader, a
    ``with_rank_override`` wrapper, a ``for`` loop over parameters): the
    fused QKV weight and bias, and the query/key norm gammas (norm modules or
    bare ``q_norm_weight`` parameters). A parameter the file's
    ``load_weights`` maps from query/key checkpoint tensors in another layout
    is refused by name; a quantized attention class (FP8) is guarded.

    Preconditions: attention classes with ``self.head_dim``, ``self.q_size``
    and ``self.kv_size`` assigned in ``__init__`` and a loader on
    ``self.qkv_proj_weight``.
    """

    ID = ID
    REALIZES = Realizes({"rope.style": to("interleaved")})
    Params = NoParams
    NEEDS_REAL_MODEL = True
    PITFALLS = (
        Pitfall(
            150,
            lambda spec, facts: spec.rope.style == "interleaved",
            "interleaved RoPE pairs (2i, 2i+1): the kernels pair (i, i + d/2); permute Q/K columns at load",
        ),
    )
    AFTER = ("add-qkv-bias", "qk-norm", "fused-checkpoint")
    EXAMPLES = (
        Example(
            title="query/key columns reordered at load time",
            before="""
                from vllm_neuron.utils.weight_loader import fused_qkv_weight_loader, set_weight_loader


                class HeliumAttention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.head_dim = config.head_dim
                        self.q_size = self.num_attention_heads_per_rank * self.head_dim
                        self.kv_size = self.num_key_value_heads_per_rank * self.head_dim
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, self.q_size + 2 * self.kv_size))
                        self._setup_weight_loaders()

                    def _setup_weight_loaders(self):
                        set_weight_loader(
                            self.qkv_proj_weight,
                            fused_qkv_weight_loader(q_size=self.q_size, kv_size=self.kv_size),
                        )
            """,
            after='''
                from vllm_neuron.utils.weight_loader import SafetensorsWeightLoader, fused_qkv_weight_loader, get_weight_loader, set_weight_loader


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


                class HeliumAttention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.head_dim = config.head_dim
                        self.q_size = self.num_attention_heads_per_rank * self.head_dim
                        self.kv_size = self.num_key_value_heads_per_rank * self.head_dim
                        # <-- MODEL-SPECIFIC: checkpoint RoPE pairs moved to the pairs (i, i + head_dim / 2) rotated here
                        self.rope_column_order = _rope_column_order(self.head_dim, rotary_dim=self.head_dim, interleaved=True)
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, self.q_size + 2 * self.kv_size))
                        self._setup_weight_loaders()

                    def _setup_weight_loaders(self):
                        set_weight_loader(
                            self.qkv_proj_weight,
                            fused_qkv_weight_loader(q_size=self.q_size, kv_size=self.kv_size),
                        )
                        set_weight_loader(
                            self.qkv_proj_weight,
                            _rope_columns_loader(get_weight_loader(self.qkv_proj_weight), self.rope_column_order, self.q_size + self.kv_size),
                        )
            ''',
        ),
        Example(
            title="loaders in a local, in a rank override and in a loop (real vllm_neuron shapes)",
            before="""
                from vllm_neuron.utils.weight_loader import set_weight_loader


                class HeliumAttention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.head_dim = config.head_dim
                        self.q_size = self.num_attention_heads_per_rank * self.head_dim
                        self.kv_size = self.num_key_value_heads_per_rank * self.head_dim
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, self.q_size + 2 * self.kv_size))
                        self.qkv_proj_bias = nn.Parameter(torch.zeros(self.q_size + 2 * self.kv_size))
                        self.q_norm_weight = nn.Parameter(torch.ones(self.head_dim))
                        self.k_norm_weight = nn.Parameter(torch.ones(self.head_dim))
                        self._setup_weight_loaders()

                    def _setup_weight_loaders(self):
                        qkv_loader = fused_qkv_weight_loader(q_size=self.q_size, kv_size=self.kv_size)
                        set_weight_loader(self.qkv_proj_weight, qkv_loader)
                        set_weight_loader(self.qkv_proj_bias, with_rank_override(fused_qkv_bias_loader(self.q_size, self.kv_size), rank=self.rank))
                        for gamma in (self.q_norm_weight, self.k_norm_weight):
                            set_weight_loader(gamma, replicated_loader())
            """,
            after='''
                from vllm_neuron.utils.weight_loader import SafetensorsWeightLoader, get_weight_loader, set_weight_loader


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


                class HeliumAttention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.head_dim = config.head_dim
                        self.q_size = self.num_attention_heads_per_rank * self.head_dim
                        self.kv_size = self.num_key_value_heads_per_rank * self.head_dim
                        # <-- MODEL-SPECIFIC: checkpoint RoPE pairs moved to the pairs (i, i + head_dim / 2) rotated here
                        self.rope_column_order = _rope_column_order(self.head_dim, rotary_dim=self.head_dim, interleaved=True)
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, self.q_size + 2 * self.kv_size))
                        self.qkv_proj_bias = nn.Parameter(torch.zeros(self.q_size + 2 * self.kv_size))
                        self.q_norm_weight = nn.Parameter(torch.ones(self.head_dim))
                        self.k_norm_weight = nn.Parameter(torch.ones(self.head_dim))
                        self._setup_weight_loaders()

                    def _setup_weight_loaders(self):
                        qkv_loader = fused_qkv_weight_loader(q_size=self.q_size, kv_size=self.kv_size)
                        set_weight_loader(self.qkv_proj_weight, qkv_loader)
                        set_weight_loader(
                            self.qkv_proj_weight,
                            _rope_columns_loader(get_weight_loader(self.qkv_proj_weight), self.rope_column_order, self.q_size + self.kv_size),
                        )
                        set_weight_loader(self.qkv_proj_bias, with_rank_override(fused_qkv_bias_loader(self.q_size, self.kv_size), rank=self.rank))
                        set_weight_loader(
                            self.qkv_proj_bias,
                            _rope_columns_loader(get_weight_loader(self.qkv_proj_bias), self.rope_column_order, self.q_size + self.kv_size),
                        )
                        for gamma in (self.q_norm_weight, self.k_norm_weight):
                            set_weight_loader(gamma, replicated_loader())
                        set_weight_loader(
                            self.q_norm_weight,
                            _rope_columns_loader(get_weight_loader(self.q_norm_weight), self.rope_column_order, self.head_dim),
                        )
                        set_weight_loader(
                            self.k_norm_weight,
                            _rope_columns_loader(get_weight_loader(self.k_norm_weight), self.rope_column_order, self.head_dim),
                        )
            ''',
        ),
        Example(
            title="no loader to reorder",
            before="""
                class HeliumAttention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.head_dim = 16
                        self.q_size = 64
                        self.kv_size = 32
                        self.qkv_proj_weight = nn.Parameter(torch.empty(64, 128))
            """,
            raises="interleaved-rope: HeliumAttention attaches no loader to self.qkv_proj_weight",
        ),
    )

    @classmethod
    def params_for(cls, diffs, target, port: PortContext) -> NoParams:
        return NoParams()

    def transform_module(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        return reorder_rope_columns(module, ctx, interleaved=True)
