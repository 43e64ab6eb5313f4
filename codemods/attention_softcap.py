"""attention-softcap: tanh softcapping of the attention scores (Gemma 2)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import libcst as cst

from autoport_cst.spec.pitfalls import Pitfall
from autoport_cst.transform import Codemod, Example, FileContext, PortContext
from autoport_cst.transform.anatomy.attention import (
    DECODE,
    FLASH,
    KERNEL_NAMES,
    SEGMENTED,
    SEGMENTED_CP,
    attention_classes_in,
    kernel_sites,
)
from autoport_cst.transform.anatomy.classes import require_method
from autoport_cst.transform.cst.snippets import parse_expr, parse_statement
from autoport_cst.transform.cst.vocabulary import find_self_assignment
from autoport_cst.transform.edit.arguments import set_keyword
from autoport_cst.transform.edit.attention import place_setting
from autoport_cst.transform.edit.config_fields import add_config_fields
from autoport_cst.transform.edit.functions import add_functions
from autoport_cst.transform.edit.kernels import guard, substitutes_for, to_unfused
from autoport_cst.transform.edit.tree import rewrite, with_comment
from autoport_cst.transform.realizes import Realizes, not_to

ID = "attention-softcap"
COMMENT = "<-- MODEL-SPECIFIC: tanh softcap of the attention scores (None: no cap)"
GUARD_COMMENT = "<-- MODEL-SPECIFIC: attention softcap: a path no substitute computes refuses"
CP_MESSAGE = (
    "attention softcap: NF.segmented_attention_cp (context-parallel prefill) has no softcap and no substitute"
)


@dataclass(frozen=True)
class AttentionSoftcapParams:
    config_key: str = field(
        default="attn_logit_softcapping",
        metadata={"doc": "Config field holding the cap (None at run time: no capping)."},
    )


class AttentionSoftcap(Codemod):
    """Softcap the attention scores, ``cap * tanh(scores / cap)``, as Gemma 2 does.

    The cap applies after the scale and before the mask and softmax.

    No attention kernel has a softcap, so with this codemod attention is
    computed op by op on every path of the attention class, in the model
    file (``autoport_cst.transform.edit.kernels``):

    - ``NF.flash_attention(...)`` becomes ``_flash_attention_unfused(...,
      softcap=self.<key>)`` and ``NF.segmented_attention(...)`` (chunked
      prefill, prefix-cache hits) ``_segmented_attention_unfused(...)``:
      same arguments, layouts and masks (causal, sliding window, sinks);
    - ``NF.attention_decode(...)`` becomes ``_attention_decode_unfused(...,
      softcap=self.<key>)``, masked or bounded-gather alike: the kernel's
      steps with the same arguments (``NF.qkv_proj``, the QK norms, RoPE in
      the kernel's cos/sin layout, attention over each sequence's blocks
      with the kernel's mask, the in-place cache write or, with
      ``update_cache=False``, the new keys and values returned, ``NF.o_proj``);
      what it does not implement (FP8 caches, attention data parallelism,
      decode context parallelism, quantized projections) it refuses by name
      when a call sets it;
    - ``NF.segmented_attention_cp`` (context-parallel prefill) has no
      substitute: its path raises ``NotImplementedError`` when the cap is set.

    The functions a port needs are added to the module once (other codemods
    that need an unfused path share them). The attention's ``__init__`` keeps
    the cap (``self.<key> = config.<key>``, None: no capping), and the config
    dataclass gains the field. On Trainium this trades the fused kernels for
    plain tensor ops on these layers: correct, slower.

    Preconditions: an attention class with ``__init__(self, config, ...)``,
    a flash or segmented prefill call and a decode kernel call (or their
    unfused forms). A file without attention classes is left alone.
    """

    ID = ID
    REALIZES = Realizes({"attention.softcap": not_to(None)})
    Params = AttentionSoftcapParams
    NEEDS_REAL_MODEL = True
    PITFALLS = (
        Pitfall(
            90,
            lambda spec, facts: spec.attention.softcap is not None,
            "attention logits are tanh-softcapped at {spec.attention.softcap:g}: the kernels must apply it",
        ),
    )
    # after the codemods whose edits it reads or whose guards precede its own
    AFTER = ("add-qkv-bias", "unsqueeze-decode-biases", "qk-norm", "attention-sinks", "sliding-window")
    FILES = ("model", "config")
    EXAMPLES = (
        Example(
            title="both paths computed op by op (shown with the unfused functions already in the module)",
            before="""
                def _attention_decode_unfused(X, W_qkv, K_cache, V_cache, attention_mask, softcap=None, **kernel_options):
                    ...


                def _flash_attention_unfused(q, k, v, scale=None, softcap=None, **kernel_options):
                    ...


                def _softmax_attention(q, k, v, scale, visible, sink, softcap, tp_out):
                    ...


                class Gemma2Attention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.scaling = config.query_pre_attn_scalar**-0.5
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, self.qkv_size))

                    def forward_prefill(self, q, k, v):
                        return NF.flash_attention(q, k, v, scale=self.scaling, tp_q=False, tp_out=True)

                    def forward_decode(self, x, mask):
                        return NF.attention_decode(X=x, W_qkv=self.qkv_proj_weight, attention_mask=mask)
            """,
            after="""
                def _attention_decode_unfused(X, W_qkv, K_cache, V_cache, attention_mask, softcap=None, **kernel_options):
                    ...


                def _flash_attention_unfused(q, k, v, scale=None, softcap=None, **kernel_options):
                    ...


                def _softmax_attention(q, k, v, scale, visible, sink, softcap, tp_out):
                    ...


                class Gemma2Attention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.scaling = config.query_pre_attn_scalar**-0.5
                        # <-- MODEL-SPECIFIC: tanh softcap of the attention scores (None: no cap)
                        self.attn_logit_softcapping = config.attn_logit_softcapping
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, self.qkv_size))

                    def forward_prefill(self, q, k, v):
                        return _flash_attention_unfused(q, k, v, scale=self.scaling, tp_q=False, tp_out=True, softcap=self.attn_logit_softcapping)

                    def forward_decode(self, x, mask):
                        return _attention_decode_unfused(X=x, W_qkv=self.qkv_proj_weight, attention_mask=mask, softcap=self.attn_logit_softcapping)
            """,
        ),
        Example(
            title=(
                "every path: flash and segmented prefill and the decode (here with update_cache=False) "
                "substituted, the context-parallel prefill guarded"
            ),
            before="""
                def _attention_decode_unfused(X, softcap=None, **kernel_options):
                    ...


                def _flash_attention_unfused(q, k, v, softcap=None, **kernel_options):
                    ...


                def _segmented_attention_unfused(q, k_cache, v_cache, softcap=None, **kernel_options):
                    ...


                def _softmax_attention(q, k, v, scale, visible, sink, softcap, tp_out):
                    ...


                class Gemma2Attention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.scaling = config.query_pre_attn_scalar**-0.5
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, self.qkv_size))

                    def forward_prefill(self, q, k, v, meta):
                        if self.dcp_size > 1:
                            out = NF.segmented_attention_cp(q=q, k_local=k, v_local=v, scale=self.scaling)
                        elif meta["kv_segment_size"]:
                            out = NF.segmented_attention(q, k_cache=self.k_cache, v_cache=self.v_cache, scale=self.scaling)
                        else:
                            out = NF.flash_attention(q, k, v, scale=self.scaling)
                        return out

                    def forward_decode(self, x, mask, pos_ids):
                        output, k_new, v_new = NF.attention_decode(
                            X=x,
                            attention_mask=mask,
                            pos_ids=pos_ids,
                            softmax_scale=self.scaling / self.k_scale_float,
                            update_cache=False,
                        )
                        return output
            """,
            after="""
                def _attention_decode_unfused(X, softcap=None, **kernel_options):
                    ...


                def _flash_attention_unfused(q, k, v, softcap=None, **kernel_options):
                    ...


                def _segmented_attention_unfused(q, k_cache, v_cache, softcap=None, **kernel_options):
                    ...


                def _softmax_attention(q, k, v, scale, visible, sink, softcap, tp_out):
                    ...


                class Gemma2Attention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.scaling = config.query_pre_attn_scalar**-0.5
                        # <-- MODEL-SPECIFIC: tanh softcap of the attention scores (None: no cap)
                        self.attn_logit_softcapping = config.attn_logit_softcapping
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, self.qkv_size))

                    def forward_prefill(self, q, k, v, meta):
                        if self.dcp_size > 1:
                            # <-- MODEL-SPECIFIC: attention softcap: a path no substitute computes refuses
                            if self.attn_logit_softcapping is not None:
                                raise NotImplementedError(
                                    "attention softcap: NF.segmented_attention_cp (context-parallel prefill) has no softcap and no substitute"
                                )
                            out = NF.segmented_attention_cp(q=q, k_local=k, v_local=v, scale=self.scaling)
                        elif meta["kv_segment_size"]:
                            out = _segmented_attention_unfused(q, k_cache=self.k_cache, v_cache=self.v_cache, scale=self.scaling, softcap=self.attn_logit_softcapping)
                        else:
                            out = _flash_attention_unfused(q, k, v, scale=self.scaling, softcap=self.attn_logit_softcapping)
                        return out

                    def forward_decode(self, x, mask, pos_ids):
                        output, k_new, v_new = _attention_decode_unfused(
                            X=x,
                            attention_mask=mask,
                            pos_ids=pos_ids,
                            softmax_scale=self.scaling / self.k_scale_float,
                            update_cache=False,
                            softcap=self.attn_logit_softcapping,
                        )
                        return output
            """,
        ),
        Example(
            title="the config field",
            role="config",
            path="config.py",
            before="""
                @dataclass
                class Gemma2Config:
                    head_dim: int | None = None
                    torch_dtype: torch.dtype = torch.bfloat16
            """,
            after="""
                @dataclass
                class Gemma2Config:
                    head_dim: int | None = None
                    # <-- MODEL-SPECIFIC: fields of this architecture's features (sorted by name)
                    # tanh softcap of the attention scores (None: no cap)
                    attn_logit_softcapping: float | None = None
                    torch_dtype: torch.dtype = torch.bfloat16
            """,
        ),
        Example(
            title="no prefill attention call",
            before="""
                class Gemma2Attention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, self.qkv_size))

                    def forward_prefill(self, q, k, v):
                        return NF.ring_attention(q, k, v)

                    def forward_decode(self, x):
                        return NF.attention_decode(X=x)
            """,
            raises="attention-softcap: no NF.flash_attention(...) call in Gemma2Attention",
        ),
    )

    @classmethod
    def check_params(cls, params: AttentionSoftcapParams) -> list[str]:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", params.config_key):
            return [f"config_key {params.config_key!r} is not an identifier"]
        return []

    @classmethod
    def params_for(cls, diffs, target, port: PortContext) -> AttentionSoftcapParams:
        return AttentionSoftcapParams()

    def transform_module(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        key = self.params.config_key
        if ctx.role == "config":
            return add_config_fields(
                module,
                ctx,
                [(f"{key}: float | None = None", "tanh softcap of the attention scores (None: no cap)")],
            )
        edits: dict = {}
        kinds: set[str] = set()
        for cls in attention_classes_in(module, ctx):
            self._attention_edits(cls, module, ctx, edits, kinds)
        module = rewrite(module, edits)
        return add_functions(module, substitutes_for(kinds))

    def _attention_edits(
        self, cls: cst.ClassDef, module: cst.Module, ctx: FileContext, edits: dict, kinds: set[str]
    ) -> None:
        key, name = self.params.config_key, cls.name.value
        init = require_method(module, ctx, cls, "__init__")
        sites = kernel_sites(cls)
        if not any(site.kind in (FLASH, SEGMENTED) for site in sites):
            raise ctx.precondition(f"{ID}: no {KERNEL_NAMES[FLASH]}(...) call in {name}", cls, module)
        if not any(site.kind == DECODE for site in sites):
            raise ctx.precondition(f"{ID}: no {KERNEL_NAMES[DECODE]}(...) call in {name}", cls, module)
        if find_self_assignment(init, key) is None:
            params = [p.name.value for p in init.params.params]
            config = params[1] if len(params) > 1 else "config"
            stmt = with_comment(parse_statement(f"self.{key} = {config}.{key}", module), COMMENT)
            if not place_setting(init, key, stmt, edits):
                raise ctx.precondition(
                    f"{ID}: {name}.__init__ sets none of self.scaling / self.head_dim / self.layer_idx "
                    "to place the cap after",
                    init,
                    module,
                )
        cap = parse_expr(f"self.{key}", module)
        for site in sites:
            if site.kind == SEGMENTED_CP:
                guard(module, ctx, site, f"self.{key} is not None", CP_MESSAGE, edits, GUARD_COMMENT)
                continue
            kinds.add(site.kind)
            edits[id(site.call)] = lambda updated, kind=site.kind: set_keyword(
                to_unfused(updated, kind), "softcap", cap
            )
