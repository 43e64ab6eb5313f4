"""qk-norm: RMSNorm of queries and keys before RoPE, per head (Qwen3) or over all heads (OLMo 2);
LayerNorm per head (Persimmon)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import libcst as cst

from autoport_cst.spec.pitfalls import Pitfall
from autoport_cst.transform import Codemod, Example, FileContext, PortContext
from autoport_cst.transform.anatomy.attention import attention_classes_in, statement_containing
from autoport_cst.transform.anatomy.classes import is_quantized, require_method
from autoport_cst.transform.anatomy.norm import eps_attribute, norm_has_bias, norm_is_full_width
from autoport_cst.transform.anatomy.qkv import (
    QKV_PROJ_UNFUSED,
    after_attrs,
    forward_methods,
    projections,
    stray_reads,
    unsupported_arguments,
)
from autoport_cst.transform.cst.snippets import parse_expr, parse_statements
from autoport_cst.transform.cst.vocabulary import (
    dotted,
    find_self_assignment,
    is_call,
    positional_args,
    walk,
)
from autoport_cst.transform.edit import qk_norm_code as code
from autoport_cst.transform.edit.arguments import set_keyword
from autoport_cst.transform.edit.functions import add_functions, parse_method
from autoport_cst.transform.edit.guards import declare_guarded, guard_edit
from autoport_cst.transform.edit.imports import ensure_import_from
from autoport_cst.transform.edit.kernels import DECODE_UNFUSED, to_unfused_decode
from autoport_cst.transform.edit.qkv import QKV_PROJ_UNFUSED_FUNCTION, QKV_PROJ_UNFUSED_PARAMETERS
from autoport_cst.transform.edit.rope_columns import append_after
from autoport_cst.transform.edit.tree import (
    add_edit,
    rewrite,
    with_comment,
)
from autoport_cst.transform.realizes import Change, Realizes, from_to

ID = "qk-norm"
ROPE_CALLS = ("apply_rotary_pos_emb",)
WEIGHT_LOADERS = "vllm_neuron.utils.weight_loader"

COMMON_TYPES = "nkilib.core.utils.common_types"


@dataclass(frozen=True)
class QkNormParams:
    kind: Literal["per_head", "full_width"] = field(
        default="per_head",
        metadata={
            "doc": "per_head: one RMSNorm of head_dim shared by every head (Qwen3); full_width: "
            "RMSNorm over all query heads and over all key heads (OLMo 2)."
        },
    )
    norm: Literal["rmsnorm", "layernorm"] = field(
        default="rmsnorm",
        metadata={
            "doc": "the layer norms' kind, which the q/k norms compute (research refuses other q/k norms): "
            "rmsnorm: the kernels' own pre-RoPE q/k RMSNorm; layernorm: per head only, the model's "
            "LayerNorm class (with its bias, Persimmon) applied op by op on every attention path."
        },
    )


class QkNorm(Codemod):
    """RMSNorm (or the layer norms' LayerNorm) of the queries and keys before RoPE.

    Model file, attention class (``<Prefix>Attention``), with the model's own
    RMSNorm class (``<Prefix>RMSNorm``, built like the decoder layer's norms,
    with the same epsilon and dtype). The norm modules go in ``__init__``
    after the last parameter and after every attribute they read is assigned
    (an attribute ``__init__`` never assigns is refused by name).

    ``per_head`` (Qwen3): ``self.q_norm`` and ``self.k_norm`` of width
    ``head_dim``, replicated on every rank. Prefill: where q and k are
    rotated by ``apply_rotary_pos_emb(q, k, ...)``, the norms are applied
    right before; where RoPE is fused into ``NF.qkv_proj``
    (``cos_cache``/``sin_cache``), every such call (the plain one and the
    chunked-prefill ``use_block_kv`` one) gets the kernel's pre-RoPE norm
    (``qk_norm_pre_rope_q_norm=NormType.RMS_NORM``, the epsilon, the gammas
    as ``[1, Dh]``). Decode: every decode kernel call gets its pre-RoPE QK
    norm (``rmsnorm_QK_pre_rope_enabled=True``, the epsilon and gammas).

    ``full_width`` (OLMo 2): the norms span all query heads (``Nq * Dh``) and
    all key heads; each rank holds the slice of the weights of its heads
    (sharded loaders), and ``_full_width_rms_norm`` sums the squares over the
    TP ranks (``tp_group.all_reduce``, a KV head held by several ranks
    counted once) before normalizing. No kernel fuses a norm over all heads:
    an explicit ``apply_rotary_pos_emb`` gets it right before; a projection
    with fused RoPE becomes ``_qkv_proj_unfused`` (added to the module: the
    projection, the norm, RoPE and the ``use_block_kv`` cache write op by op,
    same arguments and results; an argument it does not take is refused);
    decode runs the decode kernel's op-by-op substitute with
    ``qk_norm=self._full_width_qk_norm``. With attention data parallelism
    (the QKV loader's ``attention_dp_size``) the query heads are spread over
    more ranks than the TP group: ``__init__`` raises NotImplementedError
    when it is on.

    ``norm="layernorm"`` (Persimmon; per head only): the model's LayerNorm
    class, its weight and bias replicated; no kernel normalises q/k heads with
    a mean and a bias, so every rotating ``NF.qkv_proj`` becomes
    ``_qkv_proj_unfused`` and every decode kernel call its op-by-op
    substitute, both with ``qk_norm=self._per_head_qk_norm``; the biases are
    mapped beside the weights.

    ``load_weights`` (of every file that maps the attention) maps
    ``...self_attn.q_norm.weight`` and ``...self_attn.k_norm.weight`` to the
    checkpoint keys beside ``o_proj.weight``'s.

    Preconditions: one RMSNorm class built somewhere as ``<Norm>(size, eps,
    dtype)``; q and k rotated in every prefill path either in ``NF.qkv_proj``
    or by one ``apply_rotary_pos_emb(q, k, ...)`` per method; a decode kernel
    call; no other computation with ``self.qkv_proj_weight``; a
    ``...self_attn.o_proj_weight`` mapping entry; per-head norms already in
    the attention are replaced (through ``remove-qk-norm``) when full-width
    ones are asked for; full-width norms are not turned into per-head ones.
    """

    ID = ID
    # adds norms to a reference without them, or replaces per-head norms
    # with full-width ones (remove-qk-norm first); not the other way
    REALIZES = Realizes(
        {
            "attention.qk_norm": (
                Change(reference=("none",), not_to=("none",)),
                from_to("per_head", "full_width"),
            )
        }
    )
    Params = QkNormParams
    NEEDS_REAL_MODEL = True
    PITFALLS = (
        Pitfall(
            61,
            lambda spec, facts: (
                spec.attention.qk_norm == "per_head" and spec.attention.qk_norm_position != "after_rope"
            ),
            "per-head q/k norm before RoPE: the fused-RoPE prefill and the decode kernel need the q/k gammas "
            "(qk_norm_pre_rope_*), a module norm after a fused-RoPE projection is wrong",
        ),
        Pitfall(
            62,
            lambda spec, facts: spec.attention.qk_norm == "full_width",
            "full-width q/k norm: its variance spans all heads, which TP splits across ranks "
            "(needs a cross-rank reduction or an all-gather before the norm)",
        ),
    )
    AFTER = ("swap-norm", "add-qkv-bias", "unsqueeze-decode-biases")
    EXAMPLES = (
        Example(
            title="per-head norms (Qwen3)",
            params={"kind": "per_head"},
            before="""
                class Qwen3RMSNorm(nn.Module):
                    def __init__(self, hidden_size, eps, dtype):
                        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype))
                        self.variance_epsilon = eps


                class Qwen3Attention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.head_dim = config.head_dim
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, self.qkv_size))
                        self.o_proj_weight = nn.Parameter(torch.empty(self.q_size, self.hidden_size))

                    def forward_prefill(self, q, k, cos, sin):
                        q, k = apply_rotary_pos_emb(q, k, cos, sin)
                        return q, k

                    def forward_decode(self, x):
                        return NF.attention_decode(
                            X=x,
                            rmsnorm_QK_pre_rope_enabled=False,
                            rmsnorm_QK_post_rope_enabled=False,
                        )


                class Qwen3DecoderLayer(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.input_layernorm = Qwen3RMSNorm(config.hidden_size, config.rms_norm_eps, config.torch_dtype)


                class Qwen3ForCausalLM(nn.Module):
                    def load_weights(self, path):
                        for layer_id in range(2):
                            prefix = f"model.layers.{layer_id}"
                            mappings[f"{prefix}.self_attn.o_proj_weight"] = f"{prefix}.self_attn.o_proj.weight"
            """,
            after="""
                class Qwen3RMSNorm(nn.Module):
                    def __init__(self, hidden_size, eps, dtype):
                        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype))
                        self.variance_epsilon = eps


                class Qwen3Attention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.head_dim = config.head_dim
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, self.qkv_size))
                        self.o_proj_weight = nn.Parameter(torch.empty(self.q_size, self.hidden_size))
                        # <-- MODEL-SPECIFIC: RMSNorm of each query and key head before RoPE
                        self.q_norm = Qwen3RMSNorm(self.head_dim, config.rms_norm_eps, config.torch_dtype)
                        self.k_norm = Qwen3RMSNorm(self.head_dim, config.rms_norm_eps, config.torch_dtype)

                    def forward_prefill(self, q, k, cos, sin):
                        # <-- MODEL-SPECIFIC: query and key norms before RoPE
                        q = self.q_norm(q)
                        k = self.k_norm(k)
                        q, k = apply_rotary_pos_emb(q, k, cos, sin)
                        return q, k

                    def forward_decode(self, x):
                        return NF.attention_decode(
                            X=x,
                            rmsnorm_QK_pre_rope_enabled=True,
                            rmsnorm_QK_pre_rope_eps=self.q_norm.variance_epsilon,
                            rmsnorm_QK_pre_rope_W_Q=self.q_norm.weight.view(1, -1),
                            rmsnorm_QK_pre_rope_W_K=self.k_norm.weight.view(1, -1),
                            rmsnorm_QK_post_rope_enabled=False,
                        )


                class Qwen3DecoderLayer(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.input_layernorm = Qwen3RMSNorm(config.hidden_size, config.rms_norm_eps, config.torch_dtype)


                class Qwen3ForCausalLM(nn.Module):
                    def load_weights(self, path):
                        for layer_id in range(2):
                            prefix = f"model.layers.{layer_id}"
                            mappings[f"{prefix}.self_attn.o_proj_weight"] = f"{prefix}.self_attn.o_proj.weight"
                            mappings[f"{prefix}.self_attn.q_norm.weight"] = f"{prefix}.self_attn.q_norm.weight"
                            mappings[f"{prefix}.self_attn.k_norm.weight"] = f"{prefix}.self_attn.k_norm.weight"
            """,
        ),
        Example(
            title="RoPE fused into the projection (real vllm_neuron llama3 shape): the kernel's norms on every call",
            params={"kind": "per_head"},
            before="""
                import torch


                class Qwen3RMSNorm(nn.Module):
                    def __init__(self, hidden_size, eps, dtype):
                        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype))
                        self.variance_epsilon = eps


                class Qwen3Attention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.head_dim = config.head_dim
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, qkv_size))
                        self.o_proj_weight = nn.Parameter(torch.empty(o_in, self.hidden_size))

                    def forward_prefill(self, x, cos, sin, kv_segment_size):
                        if kv_segment_size:
                            q, _, _ = NF.qkv_proj(
                                hidden=x,
                                qkv_weights=self.qkv_proj_weight,
                                cos_cache=cos,
                                sin_cache=sin,
                                use_block_kv=True,
                            )
                        else:
                            q = NF.qkv_proj(hidden=x, qkv_weights=self.qkv_proj_weight, cos_cache=cos, sin_cache=sin)
                        return q

                    def forward_decode(self, x):
                        return NF.attention_decode(X=x, W_qkv=self.qkv_proj_weight, rmsnorm_QK_pre_rope_enabled=False)


                class Qwen3DecoderLayer(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.input_layernorm = Qwen3RMSNorm(config.hidden_size, config.rms_norm_eps, config.torch_dtype)


                class Qwen3ForCausalLM(nn.Module):
                    def load_weights(self, checkpoint_path, device, cache_dir):
                        for layer_id in range(2):
                            prefix = f"model.layers.{layer_id}"
                            mappings[f"{prefix}.self_attn.o_proj_weight"] = (
                                f"{prefix}.self_attn.o_proj.weight"
                            )
            """,
            after="""
                import torch
                from nkilib.core.utils.common_types import NormType


                class Qwen3RMSNorm(nn.Module):
                    def __init__(self, hidden_size, eps, dtype):
                        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype))
                        self.variance_epsilon = eps


                class Qwen3Attention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.head_dim = config.head_dim
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, qkv_size))
                        self.o_proj_weight = nn.Parameter(torch.empty(o_in, self.hidden_size))
                        # <-- MODEL-SPECIFIC: RMSNorm of each query and key head before RoPE
                        self.q_norm = Qwen3RMSNorm(self.head_dim, config.rms_norm_eps, config.torch_dtype)
                        self.k_norm = Qwen3RMSNorm(self.head_dim, config.rms_norm_eps, config.torch_dtype)

                    def forward_prefill(self, x, cos, sin, kv_segment_size):
                        if kv_segment_size:
                            q, _, _ = NF.qkv_proj(
                                hidden=x,
                                qkv_weights=self.qkv_proj_weight,
                                cos_cache=cos,
                                sin_cache=sin,
                                use_block_kv=True,
                                qk_norm_pre_rope_q_norm=NormType.RMS_NORM,
                                qk_norm_pre_rope_k_norm=NormType.RMS_NORM,
                                qk_norm_pre_rope_eps=self.q_norm.variance_epsilon,
                                qk_norm_pre_rope_q_gamma=self.q_norm.weight.view(1, -1),
                                qk_norm_pre_rope_k_gamma=self.k_norm.weight.view(1, -1),
                            )
                        else:
                            q = NF.qkv_proj(hidden=x, qkv_weights=self.qkv_proj_weight, cos_cache=cos, sin_cache=sin, qk_norm_pre_rope_q_norm=NormType.RMS_NORM, qk_norm_pre_rope_k_norm=NormType.RMS_NORM, qk_norm_pre_rope_eps=self.q_norm.variance_epsilon, qk_norm_pre_rope_q_gamma=self.q_norm.weight.view(1, -1), qk_norm_pre_rope_k_gamma=self.k_norm.weight.view(1, -1))
                        return q

                    def forward_decode(self, x):
                        return NF.attention_decode(X=x, W_qkv=self.qkv_proj_weight, rmsnorm_QK_pre_rope_enabled=True, rmsnorm_QK_pre_rope_eps=self.q_norm.variance_epsilon, rmsnorm_QK_pre_rope_W_Q=self.q_norm.weight.view(1, -1), rmsnorm_QK_pre_rope_W_K=self.k_norm.weight.view(1, -1))


                class Qwen3DecoderLayer(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.input_layernorm = Qwen3RMSNorm(config.hidden_size, config.rms_norm_eps, config.torch_dtype)


                class Qwen3ForCausalLM(nn.Module):
                    def load_weights(self, checkpoint_path, device, cache_dir):
                        for layer_id in range(2):
                            prefix = f"model.layers.{layer_id}"
                            mappings[f"{prefix}.self_attn.o_proj_weight"] = (
                                f"{prefix}.self_attn.o_proj.weight"
                            )
                            mappings[f"{prefix}.self_attn.q_norm.weight"] = f"{prefix}.self_attn.q_norm.weight"
                            mappings[f"{prefix}.self_attn.k_norm.weight"] = f"{prefix}.self_attn.k_norm.weight"
            """,
        ),
        Example(
            title="LayerNorms with bias (Persimmon): op by op on every path, weight and bias mapped",
            params={"kind": "per_head", "norm": "layernorm"},
            before="""
                import torch


                def _qkv_proj_unfused(hidden, qkv_weights, cos_cache=None, sin_cache=None, qk_norm=None):
                    return NF.qkv_proj(hidden=hidden, qkv_weights=qkv_weights)


                def apply_rotary_pos_emb(q, k, cos, sin):
                    return q, k


                def _attention_decode_unfused(X, W_qkv, qk_norm=None, **kernel_options):
                    return X


                class PersimmonLayerNorm(nn.Module):
                    def __init__(self, hidden_size, eps, dtype):
                        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype))
                        self.bias = nn.Parameter(torch.zeros(hidden_size, dtype=dtype))
                        self.variance_epsilon = eps


                class PersimmonAttention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.head_dim = config.head_dim
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, qkv_size))
                        self.o_proj_weight = nn.Parameter(torch.empty(o_in, self.hidden_size))

                    def forward_prefill(self, x, cos, sin):
                        return NF.qkv_proj(hidden=x, qkv_weights=self.qkv_proj_weight, cos_cache=cos, sin_cache=sin)

                    def forward_decode(self, x):
                        return NF.attention_decode(X=x, W_qkv=self.qkv_proj_weight, rmsnorm_QK_pre_rope_enabled=False)


                class PersimmonDecoderLayer(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.input_layernorm = PersimmonLayerNorm(config.hidden_size, config.layer_norm_eps, config.torch_dtype)


                class PersimmonForCausalLM(nn.Module):
                    def load_weights(self, path):
                        for layer_id in range(2):
                            prefix = f"model.layers.{layer_id}"
                            mappings[f"{prefix}.self_attn.o_proj_weight"] = f"{prefix}.self_attn.o_proj.weight"
            """,
            after='''
                import torch


                def _qkv_proj_unfused(hidden, qkv_weights, cos_cache=None, sin_cache=None, qk_norm=None):
                    return NF.qkv_proj(hidden=hidden, qkv_weights=qkv_weights)


                def apply_rotary_pos_emb(q, k, cos, sin):
                    return q, k


                def _attention_decode_unfused(X, W_qkv, qk_norm=None, **kernel_options):
                    return X


                class PersimmonLayerNorm(nn.Module):
                    def __init__(self, hidden_size, eps, dtype):
                        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype))
                        self.bias = nn.Parameter(torch.zeros(hidden_size, dtype=dtype))
                        self.variance_epsilon = eps


                class PersimmonAttention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.head_dim = config.head_dim
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, qkv_size))
                        self.o_proj_weight = nn.Parameter(torch.empty(o_in, self.hidden_size))
                        # <-- MODEL-SPECIFIC: LayerNorm of each query and key head before RoPE
                        self.q_norm = PersimmonLayerNorm(self.head_dim, config.layer_norm_eps, config.torch_dtype)
                        self.k_norm = PersimmonLayerNorm(self.head_dim, config.layer_norm_eps, config.torch_dtype)

                    def forward_prefill(self, x, cos, sin):
                        return _qkv_proj_unfused(hidden=x, qkv_weights=self.qkv_proj_weight, cos_cache=cos, sin_cache=sin, qk_norm=self._per_head_qk_norm)

                    def forward_decode(self, x):
                        return _attention_decode_unfused(X=x, W_qkv=self.qkv_proj_weight, rmsnorm_QK_pre_rope_enabled=False, qk_norm=self._per_head_qk_norm)

                    def _per_head_qk_norm(self, q, k):
                        """The query and key norms of each head (q: [Nq, T, Dh], k: [Nkv, T, Dh]),
                        op by op: the model's norm over the last dimension, its weight and bias
                        of head_dim replicated on every rank."""
                        return self.q_norm(q), self.k_norm(k)


                class PersimmonDecoderLayer(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.input_layernorm = PersimmonLayerNorm(config.hidden_size, config.layer_norm_eps, config.torch_dtype)


                class PersimmonForCausalLM(nn.Module):
                    def load_weights(self, path):
                        for layer_id in range(2):
                            prefix = f"model.layers.{layer_id}"
                            mappings[f"{prefix}.self_attn.o_proj_weight"] = f"{prefix}.self_attn.o_proj.weight"
                            mappings[f"{prefix}.self_attn.q_norm.weight"] = f"{prefix}.self_attn.q_norm.weight"
                            mappings[f"{prefix}.self_attn.q_norm.bias"] = f"{prefix}.self_attn.q_norm.bias"
                            mappings[f"{prefix}.self_attn.k_norm.weight"] = f"{prefix}.self_attn.k_norm.weight"
                            mappings[f"{prefix}.self_attn.k_norm.bias"] = f"{prefix}.self_attn.k_norm.bias"
            ''',
        ),
        Example(
            title="attributes the full-width norms read that __init__ never assigns",
            params={"kind": "full_width"},
            before="""
                class Olmo2RMSNorm(nn.Module):
                    def __init__(self, hidden_size, eps, dtype):
                        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype))
                        self.variance_epsilon = eps


                class Olmo2Attention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, qkv_size))
                        self.o_proj_weight = nn.Parameter(torch.empty(o_in, self.hidden_size))
                        self.q_size = q_size
                        self.world_size = self.tp_group.world_size

                    def forward_prefill(self, q, k, cos, sin):
                        q, k = apply_rotary_pos_emb(q, k, cos, sin)
                        return q, k


                class Olmo2DecoderLayer(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.input_layernorm = Olmo2RMSNorm(config.hidden_size, config.rms_norm_eps, config.torch_dtype)
            """,
            raises="qk-norm: Olmo2Attention.__init__ assigns no self.kv_size, self.num_key_value_heads, "
            "self.num_key_value_heads_per_rank, self.num_kv_replicas, self.rank, self.tp_group",
        ),
        Example(
            title="the norm must be an RMSNorm",
            params={"kind": "per_head"},
            before="""
                class StableLmLayerNorm(nn.Module):
                    def __init__(self, hidden_size, eps, dtype):
                        self.variance_epsilon = eps


                class StableLmAttention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, self.qkv_size))
            """,
            raises="qk-norm: needs one RMSNorm class (<Prefix>RMSNorm), found StableLmLayerNorm",
        ),
    )

    @classmethod
    def params_for(cls, diffs, target, port: PortContext) -> QkNormParams:
        return QkNormParams(kind=target.attention.qk_norm, norm=target.norm.kind)

    def transform_module(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        attention = attention_classes_in(module, ctx)
        if not any(not is_quantized(c) for c in attention):
            return self._mappings(rewrite(module, self._guards(module, ctx)), ctx, required=False)
        norm = code.norm_class_of_kind(module, ctx, self.params.norm, self.params.kind)
        eps_attr = eps_attribute(norm)
        if eps_attr is None:
            raise ctx.precondition(
                f"{ID}: {norm.name.value}.__init__ stores no epsilon (self.<...eps...> = eps)", norm, module
            )
        ctor_args = code.norm_constructor_args(module, norm.name.value)
        if ctor_args is None:
            raise ctx.precondition(
                f"{ID}: {norm.name.value} is never built as {norm.name.value}(size, eps, dtype) "
                "in this file; cannot tell which epsilon and dtype the query and key norms take",
                norm,
                module,
            )
        full = self.params.kind == "full_width"
        if full and any(
            find_self_assignment(require_method(module, ctx, c, "__init__"), "q_norm") is not None
            and not norm_is_full_width(c, "q_norm")
            for c in attention
        ):
            # per-head norms (a qwen3 / qwen3_moe reference) make way for full-width ones
            from autoport_cst.transform.library import get_codemod

            remove = get_codemod("remove-qk-norm")
            module = remove(remove.parse_params({})).remove_from_attention(module, ctx)
            attention = attention_classes_in(module, ctx)
        edits = self._guards(module, ctx)
        needs = set()
        for cls in [c for c in attention if not is_quantized(c)]:
            needs |= self._attention_edits(cls, norm.name.value, eps_attr, ctor_args, module, ctx, edits)
        module = rewrite(module, edits)
        module = self._mappings(module, ctx)
        if "unfused_prefill" in needs:
            module = add_functions(module, [QKV_PROJ_UNFUSED_FUNCTION])
        if full or self.params.norm == "layernorm":
            module = add_functions(module, [DECODE_UNFUSED])
        if full:
            module = ensure_import_from(module, WEIGHT_LOADERS, "with_rank_override")
            module = ensure_import_from(module, WEIGHT_LOADERS, "sharding_weight_loader")
            module = ensure_import_from(module, WEIGHT_LOADERS, "set_weight_loader")
        if "norm_type" in needs:
            module = ensure_import_from(module, COMMON_TYPES, "NormType")
        return module

    def _guards(self, module: cst.Module, ctx: FileContext) -> dict:
        """Edits making each quantized attention class (FP8 kernels, not given
        the norms here) raise in ``__init__``, its sites declared guarded."""
        edits: dict = {}
        for cls in attention_classes_in(module, ctx):
            if is_quantized(cls):
                reason = f"q/k norms in the quantized attention {cls.name.value}"
                for key, fn in guard_edit(cls, f"{reason} are not implemented", module).items():
                    add_edit(edits, key, fn)
                declare_guarded(cls, ctx, reason)
        return edits

    # -- attention class -----------------------------------------------------------

    def _attention_edits(self, cls, norm_name, eps_attr, ctor_args, module, ctx, edits) -> set[str]:
        """Edits of one attention class; returns what the module needs beside
        (``unfused_prefill``: the op-by-op projection; ``norm_type``: NormType)."""
        name = cls.name.value
        init = require_method(module, ctx, cls, "__init__")
        full = self.params.kind == "full_width"
        existing = find_self_assignment(init, "q_norm")
        if existing is not None and full != norm_is_full_width(cls, "q_norm"):
            have = "full-width" if not full else "per-head"
            raise ctx.precondition(
                f"{ID}: {name} already has {have} q/k norms; turning them into "
                f"{self.params.kind.replace('_', '-')} ones is not supported (port from a reference "
                "without q/k norms)",
                existing,
                module,
            )
        found = projections(cls)
        stray = stray_reads(cls, "qkv_proj_weight", [p.call for p in found])
        if stray is not None:
            raise ctx.precondition(
                f"{ID}: {name} projects with self.qkv_proj_weight outside NF.qkv_proj and the decode kernel; "
                "its queries and keys would go without the norms",
                stray,
                module,
            )
        if existing is None:
            self._norm_modules(cls, init, norm_name, ctor_args, module, ctx, edits)
        needs = self._prefill_edits(cls, found, eps_attr, module, ctx, edits)
        self._decode_edits(cls, found, eps_attr, module, ctx, edits)
        return needs

    def _norm_modules(self, cls, init, norm_name, ctor_args, module, ctx, edits) -> None:
        """``self.q_norm`` / ``self.k_norm`` in ``__init__``, after the last
        parameter and after every attribute they read is assigned."""
        name = cls.name.value
        full = self.params.kind == "full_width"
        init_params = [p.name.value for p in init.params.params]
        config = init_params[1] if len(init_params) > 1 else "config"
        eps, dtype = (code.rebase(a, config) for a in ctor_args)
        guard = code.attention_dp_guard(cls, module, ctx) if full else None
        if full:
            text = code.FULL_WIDTH_NORMS.format(norm=norm_name, eps=eps, dtype=dtype)
            comment = (
                "<-- MODEL-SPECIFIC: RMSNorm over all query / all key heads before RoPE, sharded by head"
            )
            reads = set(code.FULL_WIDTH_READS)
            if guard is not None:  # before the norms: a sinks parameter placed after them follows both
                text = guard[0] + text
                reads.add(guard[1])
        else:
            text = (
                f"self.q_norm = {norm_name}(self.head_dim, {eps}, {dtype})\n"
                f"self.k_norm = {norm_name}(self.head_dim, {eps}, {dtype})\n"
            )
            comment = f"<-- MODEL-SPECIFIC: {code.NORM_NAMES[self.params.norm]} of each query and key head before RoPE"
            reads = {"head_dim"}
        reads |= {expr.split(".")[1] for expr in (eps, dtype) if expr.startswith("self.")}
        anchor, missing = after_attrs(init, reads, code.last_parameter_statement(init))
        if missing:
            raise ctx.precondition(
                f"{ID}: {name}.__init__ assigns no self.{', self.'.join(sorted(missing))} "
                "(read to build the query and key norms)",
                init,
                module,
            )
        if anchor is None:
            raise ctx.precondition(
                f"{ID}: {name}.__init__ creates no nn.Parameter to place the norms after", init, module
            )
        new = parse_statements(text, module)
        first_norm = 0 if guard is None else 1
        new[first_norm] = with_comment(new[first_norm], comment)
        append_after(edits, id(anchor), new)

    def _prefill_edits(self, cls, found, eps_attr, module, ctx, edits) -> set[str]:
        """The norms on every prefill path: fused into each ``NF.qkv_proj``
        that rotates (per-head: the kernel's pre-RoPE norm; full-width: the
        op-by-op projection), or applied right before each explicit
        ``apply_rotary_pos_emb(q, k, ...)``."""
        name = cls.name.value
        fused = [p for p in found if p.kind == "prefill" and p.fused_rope]
        needs = self._fused_prefill_edits(name, fused, eps_attr, module, ctx, edits)
        explicit = 0
        for method in forward_methods(cls):
            rope = [n for n in walk(method) if isinstance(n, cst.Call) and is_call(n, *ROPE_CALLS)]
            if not rope:
                continue
            explicit += 1
            self._explicit_norms(cls, method, rope, module, ctx, edits)
        if not fused and not explicit:
            raise ctx.precondition(
                f"{ID}: {name} rotates q and k neither in NF.qkv_proj (cos_cache/sin_cache) nor with "
                "apply_rotary_pos_emb(q, k, ...); cannot tell where the norms go",
                cls,
                module,
            )
        return needs

    def _fused_prefill_edits(self, name, fused, eps_attr, module, ctx, edits) -> set[str]:
        """The norms in each ``NF.qkv_proj`` that rotates: the kernel's
        pre-RoPE norm (per-head), or the op-by-op projection (full-width)."""
        full = self.params.kind == "full_width"
        op_by_op = full or self.params.norm == "layernorm"
        method = "self._full_width_qk_norm" if full else "self._per_head_qk_norm"
        needs: set[str] = set()
        for projection in fused:
            if op_by_op:
                unsupported = unsupported_arguments(projection.call, QKV_PROJ_UNFUSED_PARAMETERS)
                if unsupported:
                    raise ctx.precondition(
                        f"{ID}: the op-by-op projection that applies the q/k norms does not take "
                        f"{', '.join(unsupported)} of this NF.qkv_proj call in {name}.{projection.method.name.value}",
                        projection.call,
                        module,
                    )
                add_edit(
                    edits,
                    id(projection.call),
                    lambda updated: set_keyword(
                        updated.with_changes(func=cst.Name(QKV_PROJ_UNFUSED)),
                        "qk_norm",
                        parse_expr(method, module),
                    ),
                )
                needs.add("unfused_prefill")
            elif code.has_post_rope_norm(projection.call):
                ctx.unaffected(projection.call, "its per-head q/k norms are already there, after RoPE")
            else:
                add_edit(
                    edits,
                    id(projection.call),
                    lambda updated: code.prefill_norm_args(updated, eps_attr, module),
                )
                needs.add("norm_type")
        if "unfused_prefill" in needs and "apply_rotary_pos_emb" not in {
            s.name.value for s in module.body if isinstance(s, cst.FunctionDef)
        }:
            raise ctx.precondition(
                f"{ID}: the op-by-op projection rotates with the module's apply_rotary_pos_emb, which this "
                "file does not define",
                fused[0].call,
                module,
            )
        return needs

    def _explicit_norms(self, cls, method, rope, module, ctx, edits) -> None:
        name = f"{cls.name.value}.{method.name.value}"
        full = self.params.kind == "full_width"
        if any(
            isinstance(n, cst.Call) and dotted(n.func) in ("self.q_norm", "self._full_width_qk_norm")
            for n in walk(method)
        ):
            return
        if len(rope) != 1:
            raise ctx.precondition(
                f"{ID}: expected one apply_rotary_pos_emb(q, k, ...) call in {name}, found {len(rope)}",
                method,
                module,
            )
        args = positional_args(rope[0])
        if len(args) < 2 or not all(isinstance(a.value, cst.Name) for a in args[:2]):
            raise ctx.precondition(
                f"{ID}: apply_rotary_pos_emb in {name} must take q and k as names", rope[0], module
            )
        q, k = args[0].value.value, args[1].value.value
        holder = statement_containing(method, rope[0])
        if holder is None:
            raise ctx.precondition(
                f"{ID}: apply_rotary_pos_emb in {name} is not in a top-level statement of the method",
                rope[0],
                module,
            )
        text = (
            f"{q}, {k} = self._full_width_qk_norm({q}, {k})\n"
            if full
            else f"{q} = self.q_norm({q})\n{k} = self.k_norm({k})\n"
        )
        new = parse_statements(text, module)
        new[0] = with_comment(new[0], "<-- MODEL-SPECIFIC: query and key norms before RoPE")

        def place(updated, new=new):
            first = new[0].with_changes(leading_lines=[*updated.leading_lines, *new[0].leading_lines])
            return cst.FlattenSentinel([first, *new[1:], updated.with_changes(leading_lines=[])])

        add_edit(edits, id(holder), place)

    def _decode_edits(self, cls, found, eps_attr, module, ctx, edits) -> None:
        name = cls.name.value
        full = self.params.kind == "full_width"
        kernels = [p for p in found if p.kind == "decode"]
        if not kernels:
            raise ctx.precondition(f"{ID}: no NF.attention_decode(...) call in {name}", cls, module)
        if full or self.params.norm == "layernorm":
            method = "_full_width_qk_norm" if full else "_per_head_qk_norm"
            for projection in kernels:
                add_edit(
                    edits,
                    id(projection.call),
                    lambda updated: set_keyword(
                        to_unfused_decode(updated), "qk_norm", parse_expr(f"self.{method}", module)
                    ),
                )
            if all(s.name.value != method for s in cls.body.body if isinstance(s, cst.FunctionDef)):
                texts = (code.FULL_WIDTH_METHOD, code.FULL_WIDTH_NORM) if full else (code.PER_HEAD_METHOD,)
                methods = [parse_method(text, module) for text in texts]
                methods = [m.with_changes(leading_lines=[cst.EmptyLine(indent=False)]) for m in methods]
                append_after(edits, id(kernels[-1].method), methods)
            return
        for projection in kernels:
            if code.has_post_rope_norm(projection.call):
                ctx.unaffected(projection.call, "its per-head q/k norms are already there, after RoPE")
                continue
            add_edit(
                edits, id(projection.call), lambda updated: code.decode_norm_args(updated, eps_attr, module)
            )

    # -- load_weights ------------------------------------------------------------------

    def _mappings(self, module: cst.Module, ctx: FileContext, required: bool = True) -> cst.Module:
        """``...q_norm.weight`` / ``...k_norm.weight`` entries (and their
        biases, for LayerNorms with bias) after each ``...self_attn.o_proj_weight``
        one, their checkpoint keys derived from its checkpoint key."""
        tensors = (
            ("weight", "bias") if self.params.norm == "layernorm" and norm_has_bias(module) else ("weight",)
        )
        return code.norm_mappings(module, ctx, tensors, required)
