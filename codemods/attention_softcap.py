"""attention-softcap: tanh softcapping of the attention scores (Gemma 2)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import libcst as cst

from autoport_cst.transform import Codemod, Example, FileContext, PortContext
from autoport_cst.transform.arguments import set_keyword
from autoport_cst.transform.attention import (
    DECODE_UNFUSED,
    PREFILL_UNFUSED,
    UNFUSED_DECODE_CALL,
    UNFUSED_PREFILL_CALL,
    add_functions,
    attention_classes,
    calls_in,
    place_setting,
    to_unfused_decode,
    to_unfused_prefill,
)
from autoport_cst.transform.config_fields import add_config_fields
from autoport_cst.transform.cst_helpers import (
    find_self_assignment,
    parse_expr,
    parse_statement,
    rewrite,
    with_comment,
)
from autoport_cst.transform.layers import require_method

ID = "attention-softcap"


@dataclass(frozen=True)
class AttentionSoftcapParams:
    config_key: str = field(
        default="attn_logit_softcapping",
        metadata={"doc": "Config field holding the cap (None at run time: no capping)."},
    )


class AttentionSoftcap(Codemod):
    """Softcap the attention scores, ``cap * tanh(scores / cap)``, as Gemma 2 does.

    The cap applies after the scale and before the mask and softmax.

    Neither attention kernel has a softcap, so with this codemod attention is
    computed op by op on both paths, in the model file:

    - prefill: the ``NF.flash_attention(...)`` call becomes
      ``_flash_attention_unfused(..., softcap=self.<key>)`` (same arguments,
      same layouts; causal and sliding-window masks, sinks);
    - decode: the ``NF.attention_decode(...)`` call becomes
      ``_attention_decode_unfused(..., softcap=self.<key>)``: the kernel's
      steps with the same arguments (``NF.qkv_proj``, pre-RoPE QK norm, RoPE
      from the kernel's cos/sin layout, the in-place paged cache write,
      attention over each sequence's blocks with the kernel's mask,
      ``NF.o_proj``).

    Both functions are added to the module once (other codemods that need an
    unfused path share them). The attention's ``__init__`` keeps the cap
    (``self.<key> = config.<key>``, None: no capping), and the config
    dataclass gains the field. On Trainium this trades the fused kernels for
    plain tensor ops on these layers: correct, slower.

    Preconditions: an attention class with ``__init__(self, config, ...)``,
    an ``NF.flash_attention`` call in ``forward_prefill`` and an
    ``NF.attention_decode`` call in ``forward_decode`` (or their unfused
    forms).
    """

    ID = ID
    REALIZES = ("attention.softcap",)
    Params = AttentionSoftcapParams
    AFTER = ("add-qkv-bias", "unsqueeze-decode-biases", "qk-norm")
    FILES = ("model", "config")
    EXAMPLES = (
        Example(
            title="both paths computed op by op (shown with the unfused functions already in the module)",
            before="""
                def _attention_decode_unfused(X, W_qkv, K_cache, V_cache, attention_mask, softcap=None, **kernel_options):
                    ...


                def _flash_attention_unfused(q, k, v, scale=None, softcap=None, **kernel_options):
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
                        return NF.segmented_attention(q, k, v)

                    def forward_decode(self, x):
                        return NF.attention_decode(X=x)
            """,
            raises="attention-softcap: no NF.flash_attention(...) call in Gemma2Attention.forward_prefill",
        ),
    )

    @classmethod
    def check_params(cls, params: AttentionSoftcapParams) -> list[str]:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", params.config_key):
            return [f"config_key {params.config_key!r} is not an identifier"]
        return []

    @classmethod
    def realizes(cls, diff) -> bool:
        return diff.path in cls.REALIZES and diff.target is not None

    @classmethod
    def params_for(cls, diffs, target, port: PortContext) -> AttentionSoftcapParams:
        return AttentionSoftcapParams()

    def transform_module(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        key = self.params.config_key
        comment = "<-- MODEL-SPECIFIC: tanh softcap of the attention scores (None: no cap)"
        if ctx.role == "config":
            return add_config_fields(
                module, ctx, ID, [(f"{key}: float | None = None", "tanh softcap of the attention scores (None: no cap)")]
            )
        edits: dict = {}
        cap = parse_expr(f"self.{key}", module)
        for cls in attention_classes(module, ctx, ID):
            name = cls.name.value
            init = require_method(cls, "__init__", ctx, module, ID)
            prefill = require_method(cls, "forward_prefill", ctx, module, ID)
            decode = require_method(cls, "forward_decode", ctx, module, ID)
            flash = calls_in(prefill, "NF.flash_attention") + calls_in(prefill, UNFUSED_PREFILL_CALL)
            if not flash:
                raise ctx.precondition(
                    f"{ID}: no NF.flash_attention(...) call in {name}.forward_prefill", prefill, module
                )
            kernel = calls_in(decode, "NF.attention_decode") + calls_in(decode, UNFUSED_DECODE_CALL)
            if not kernel:
                raise ctx.precondition(
                    f"{ID}: no NF.attention_decode(...) call in {name}.forward_decode", decode, module
                )
            if find_self_assignment(init, key) is None:
                params = [p.name.value for p in init.params.params]
                config = params[1] if len(params) > 1 else "config"
                stmt = with_comment(parse_statement(f"self.{key} = {config}.{key}", module), comment)
                if not place_setting(init, key, stmt, edits):
                    raise ctx.precondition(
                        f"{ID}: {name}.__init__ sets none of self.scaling / self.head_dim / self.layer_idx "
                        "to place the cap after",
                        init,
                        module,
                    )
            for call in flash:
                edits[id(call)] = lambda updated: set_keyword(to_unfused_prefill(updated), "softcap", cap)
            for call in kernel:
                edits[id(call)] = lambda updated: set_keyword(to_unfused_decode(updated), "softcap", cap)
        module = rewrite(module, edits)
        return add_functions(module, [DECODE_UNFUSED, PREFILL_UNFUSED])
