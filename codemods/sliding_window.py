"""sliding-window: sliding-window attention on every layer or on the layers the config marks."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import libcst as cst

from autoport_cst.spec.pitfalls import Pitfall
from autoport_cst.transform import Codemod, Example, FileContext, PortContext
from autoport_cst.transform.anatomy.attention import (
    DECODE,
    FLASH,
    KERNEL_NAMES,
    SEGMENTED,
    SEGMENTED_CP,
    KernelSite,
    attention_classes_in,
    kernel_sites,
)
from autoport_cst.transform.anatomy.classes import require_method
from autoport_cst.transform.cst.roles import class_role
from autoport_cst.transform.cst.snippets import parse_expr, parse_statement
from autoport_cst.transform.cst.vocabulary import (
    code_of,
    dotted,
    find_self_assignment,
    is_none,
    keyword_arg,
    nodes_of,
    statements,
    walk,
)
from autoport_cst.transform.edit.arguments import set_keyword
from autoport_cst.transform.edit.attention import drop_unused_function, place_setting
from autoport_cst.transform.edit.backbone_masks import (
    DecodeMasks,
    MaskStart,
    caller_mask_edits,
    decode_mask_start_edits,
)
from autoport_cst.transform.edit.config_fields import add_config_fields
from autoport_cst.transform.edit.functions import add_functions
from autoport_cst.transform.edit.kernels import argument, guard, guard_statement, innermost_statement
from autoport_cst.transform.edit.tree import rewrite, with_comment
from autoport_cst.transform.realizes import ANY, Realizes, not_to

ID = "sliding-window"

LAYER_FUNCTION = '''
def _layer_sliding_window(config, layer_idx: int) -> int | None:
    """The attention window of one layer in tokens, or None for full attention.

    ``config.{types_key}`` marks each layer {marks}; {fallback_doc}
    """
    if config.sliding_window is None or not config.use_sliding_window:
        return None
    if config.{types_key} is not None:
        if config.{types_key}[layer_idx] == "{sliding_type}":
            return config.sliding_window
        return None
{fallback_code}
'''

FALLBACKS = {
    "none": (
        "a config without it does not say which layers slide.",
        '    raise ValueError("the config sets sliding_window but no layer_types")',
    ),
    "max_window_layers": (
        "without it, the layers from ``max_window_layers`` on slide.",
        "    if layer_idx >= config.max_window_layers:\n"
        "        return config.sliding_window\n"
        "    return None",
    ),
    "even_layers": (
        "without it, the even-numbered layers slide.",
        "    if layer_idx % 2 == 0:\n        return config.sliding_window\n    return None",
    ),
}


def layer_function(fallback: str, key: str = "layer_types", sliding: str = "sliding_attention") -> str:
    """``_layer_sliding_window``: the layers ``config.<key>`` marks
    ``sliding`` slide, and without that list, the ``fallback`` rule."""
    doc, code = FALLBACKS[fallback]
    marks = (
        '"sliding_attention" or\n    "full_attention"'
        if sliding == "sliding_attention"
        else f'"{sliding}"\n    when it slides'
    )
    if key != "layer_types":
        doc, code = doc.replace("layer_types", key), code.replace("layer_types", key)
    return LAYER_FUNCTION.format(
        types_key=key, sliding_type=sliding, marks=marks, fallback_doc=doc, fallback_code=code
    )


CONFIG_FIELDS = [
    ("sliding_window: int | None = None", "attention window in tokens (None: full attention)"),
    ("use_sliding_window: bool = True", ""),
]
MAX_WINDOW_FIELD = [("max_window_layers: int | None = None", "")]

WINDOW_START = '''
def _window_start(pos_ids, window):
    """The first position each query of a sliding-window layer sees,
    ``pos_ids - window + 1`` clamped at 0 (None: full attention, or no positions)."""
    if window is None or pos_ids is None:
        return None
    return torch.clamp(pos_ids - (window - 1), min=0)
'''

GUARD_COMMENT = "<-- MODEL-SPECIFIC: sliding window: a path whose kernel cannot mask it refuses"
CP_MESSAGE = "sliding-window attention: NF.segmented_attention_cp (context-parallel prefill) takes no window"
DCP_MESSAGE = (
    "sliding-window attention: the context-parallel decode mask (local_filled_slots) takes no window"
)
BLOCKS_MESSAGE = "sliding-window attention: NF.segmented_attention needs a window of whole KV-cache blocks"
MASK = MaskStart(start_function="_window_start", dcp_message=DCP_MESSAGE, guard_comment=GUARD_COMMENT)


@dataclass(frozen=True)
class SlidingWindowParams:
    layers: Literal["all", "per_layer"] = field(
        default="all",
        metadata={"doc": "Every layer slides (Mistral), or the layers the config's layer_types marks."},
    )
    layer_types_key: str = field(
        default="layer_types",
        metadata={
            "doc": "per_layer: the config field listing each layer's attention type (GPT-Neo: attention_layers)."
        },
    )
    sliding_layer_type: str = field(
        default="sliding_attention",
        metadata={"doc": "per_layer: the entry of that list that marks a sliding layer (GPT-Neo: local)."},
    )
    without_layer_types: Literal["none", "max_window_layers", "even_layers"] = field(
        default="none",
        metadata={
            "doc": "per_layer: which layers slide when the config has no layer_types "
            "(none: refuse; max_window_layers: Qwen2; even_layers: Gemma 2, GPT-OSS)."
        },
    )


class SlidingWindow(Codemod):
    """Sliding-window attention on every layer or on the layers the config marks.

    A query at position p sees the keys at positions p - window + 1 .. p
    (transformers' mask keeps ``kv > q - window``, for Mistral, Qwen2/3,
    Gemma 2/3 and Cohere 2 alike).

    Model file, attention class (``<Prefix>Attention``):

    - ``__init__``: ``self.sliding_window``, the layer's window or None. With
      ``layers="all"`` it is ``config.sliding_window`` on every layer; with
      ``"per_layer"`` it comes from ``_layer_sliding_window(config,
      layer_idx)`` (added to the module), which reads ``config.layer_types``
      and, per ``without_layer_types``, falls back to ``max_window_layers`` or
      to the even layers. ``use_sliding_window=False`` (Qwen2) turns it off.

    Every attention kernel of the class, on every path
    (``autoport_cst.transform.edit.kernels``):

    - ``NF.flash_attention`` and ``NF.segmented_attention`` (chunked prefill,
      prefix-cache hits) get ``sliding_window=self.sliding_window``; the
      segmented kernel masks whole KV-cache blocks only, so its path raises
      ``NotImplementedError`` for a window that is not a multiple of the
      call's ``block_size``;
    - ``NF.segmented_attention_cp`` (context-parallel prefill, or a helper
      wrapping it) takes no window: its path raises when the layer slides;
    - decode: each ``NF.gen_attention_decode_mask`` of the decode method gets
      ``start_pos = clamp(pos_ids - (window - 1), min=0)`` (None for
      full-attention layers), so prior slots before the window are masked; a
      kernel call that builds its mask from ``pos_ids=`` (bounded gather) gets
      ``swa_start_pos_ids=_window_start(pos_ids, self.sliding_window)``; the
      context-parallel mask (``local_filled_slots=``) ignores the window, so
      that path raises when the layer slides; a mask kept in a dict for the
      next layers (``meta[KEY] = mask`` ... ``meta.get(KEY)``) is keyed by
      the window too; a mask the decode method takes from its caller (the
      real MoE backbone builds the step's mask once, in a module function
      without a window) becomes one mask per window of the layers, still
      built once per step, each layer handed the mask of its window
      (``autoport_cst.transform.edit.backbone_masks``).

    ``get_kv_spec``: each ``LayerSpec`` gets ``sliding_window_size`` from its
    layer's attention (every file that has one; a file with a causal-LM
    class must). Config file: the dataclass gains ``sliding_window``,
    ``use_sliding_window`` and, per layer, ``layer_types`` (and
    ``max_window_layers`` for that fallback).

    Preconditions: an attention class with ``__init__(self, config,
    layer_idx)``, a flash attention and a decode kernel call, and for each
    decode kernel call a mask built in its method or ``pos_ids=``. A file
    without attention classes (an FP8 variant's helpers) is left alone. A
    runner that trims block tables for windowed layers
    (``swa_kv_pos_offset``) is not handled: the decode mask assumes slot
    ``s`` holds position ``s``.
    """

    ID = ID
    REALIZES = Realizes(
        {
            "attention.sliding_window": not_to("none"),
            "attention.layer_types_key": ANY,  # the per-layer list read, and its sliding entry
            "attention.sliding_layer_type": ANY,
        }
    )
    # each guards the context-parallel prefill before its kernel: one order, one text
    AFTER = ("attention-sinks",)
    Params = SlidingWindowParams
    NEEDS_REAL_MODEL = True
    PITFALLS = (
        Pitfall(
            70,
            lambda spec, facts: spec.attention.sliding_window != "none",
            "sliding window ({spec.attention.sliding_window}, {spec.attention.sliding_window_size} tokens): "
            "decode start positions, masks and the KV-cache LayerSpec must carry the window",
        ),
    )
    FILES = ("model", "config")
    EXAMPLES = (
        Example(
            title="every layer slides (Mistral)",
            params={"layers": "all"},
            before="""
                class LlamaAttention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.head_dim = config.head_dim
                        self.scaling = self.head_dim**-0.5
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, self.qkv_size))

                    def forward_prefill(self, q, k, v):
                        return NF.flash_attention(q, k, v, scale=self.scaling, tp_q=False, tp_out=True)

                    def forward_decode(self, x, positions, meta):
                        tokens = x.shape[0]
                        mask = NF.gen_attention_decode_mask(
                            pos_ids=positions.view(1, tokens).to(torch.float32),
                            bs=1,
                            start_pos=None,
                        )
                        return NF.attention_decode(X=x, attention_mask=mask)


                class LlamaForCausalLM(nn.Module):
                    def get_kv_spec(self):
                        layers = [
                            LayerSpec(
                                name=layer.self_attn.layer_name,
                                num_kv_heads=layer.self_attn.num_key_value_heads_per_rank,
                                sliding_window_size=None,
                            )
                            for layer in self.model.layers
                        ]
                        return KVSpec(layers=layers)
            """,
            after="""
                class LlamaAttention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.head_dim = config.head_dim
                        self.scaling = self.head_dim**-0.5
                        # <-- MODEL-SPECIFIC: sliding-window attention (window in tokens, None: full attention)
                        self.sliding_window = config.sliding_window if config.use_sliding_window else None
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, self.qkv_size))

                    def forward_prefill(self, q, k, v):
                        return NF.flash_attention(q, k, v, scale=self.scaling, sliding_window=self.sliding_window, tp_q=False, tp_out=True)

                    def forward_decode(self, x, positions, meta):
                        tokens = x.shape[0]
                        # <-- MODEL-SPECIFIC: sliding window: mask prior positions before p - window + 1
                        start_pos = None
                        if self.sliding_window is not None:
                            start_pos = torch.clamp(positions.view(1, tokens).to(torch.float32) - (self.sliding_window - 1), min=0)
                        mask = NF.gen_attention_decode_mask(
                            pos_ids=positions.view(1, tokens).to(torch.float32),
                            bs=1,
                            start_pos=start_pos,
                        )
                        return NF.attention_decode(X=x, attention_mask=mask)


                class LlamaForCausalLM(nn.Module):
                    def get_kv_spec(self):
                        layers = [
                            LayerSpec(
                                name=layer.self_attn.layer_name,
                                num_kv_heads=layer.self_attn.num_key_value_heads_per_rank,
                                sliding_window_size=layer.self_attn.sliding_window,
                            )
                            for layer in self.model.layers
                        ]
                        return KVSpec(layers=layers)
            """,
        ),
        Example(
            title=(
                "every path: flash and segmented prefill (in whole blocks), the context-parallel prefill and "
                "decode mask guarded, the masked and the bounded-gather decode"
            ),
            params={"layers": "all"},
            before="""
                class LlamaAttention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.scaling = config.head_dim**-0.5
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, self.qkv_size))

                    def forward_prefill(self, q, k, v, meta):
                        block_size = meta["block_size"]
                        if self.dcp_size > 1:
                            out = NF.segmented_attention_cp(q=q, k_local=k, v_local=v, block_size=block_size, scale=self.scaling)
                        elif meta["kv_segment_size"]:
                            out = NF.segmented_attention(q, k_cache=self.k_cache, block_size=block_size, scale=self.scaling)
                        else:
                            out = NF.flash_attention(q, k, v, scale=self.scaling)
                        return out

                    def forward_decode(self, x, positions, local_filled):
                        pos_ids = positions.view(1, -1)
                        if self.bounded_gather:
                            pos_ids = pos_ids.to(torch.float32)
                            mask = None
                        else:
                            mask = NF.gen_attention_decode_mask(
                                pos_ids=pos_ids.to(torch.float32),
                                start_pos=None,
                                local_filled_slots=local_filled,
                            )
                            pos_ids = None
                        return NF.attention_decode(X=x, attention_mask=mask, pos_ids=pos_ids)
            """,
            after='''
                def _window_start(pos_ids, window):
                    """The first position each query of a sliding-window layer sees,
                    ``pos_ids - window + 1`` clamped at 0 (None: full attention, or no positions)."""
                    if window is None or pos_ids is None:
                        return None
                    return torch.clamp(pos_ids - (window - 1), min=0)


                class LlamaAttention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.scaling = config.head_dim**-0.5
                        # <-- MODEL-SPECIFIC: sliding-window attention (window in tokens, None: full attention)
                        self.sliding_window = config.sliding_window if config.use_sliding_window else None
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, self.qkv_size))

                    def forward_prefill(self, q, k, v, meta):
                        block_size = meta["block_size"]
                        if self.dcp_size > 1:
                            # <-- MODEL-SPECIFIC: sliding window: a path whose kernel cannot mask it refuses
                            if self.sliding_window is not None:
                                raise NotImplementedError(
                                    "sliding-window attention: NF.segmented_attention_cp (context-parallel prefill) takes no window"
                                )
                            out = NF.segmented_attention_cp(q=q, k_local=k, v_local=v, block_size=block_size, scale=self.scaling)
                        elif meta["kv_segment_size"]:
                            # <-- MODEL-SPECIFIC: sliding window: a path whose kernel cannot mask it refuses
                            if self.sliding_window is not None and self.sliding_window % block_size != 0:
                                raise NotImplementedError(
                                    "sliding-window attention: NF.segmented_attention needs a window of whole KV-cache blocks"
                                )
                            out = NF.segmented_attention(q, k_cache=self.k_cache, block_size=block_size, scale=self.scaling, sliding_window=self.sliding_window)
                        else:
                            out = NF.flash_attention(q, k, v, scale=self.scaling, sliding_window=self.sliding_window)
                        return out

                    def forward_decode(self, x, positions, local_filled):
                        pos_ids = positions.view(1, -1)
                        if self.bounded_gather:
                            pos_ids = pos_ids.to(torch.float32)
                            mask = None
                        else:
                            # <-- MODEL-SPECIFIC: sliding window: a path whose kernel cannot mask it refuses
                            if self.sliding_window is not None and local_filled is not None:
                                raise NotImplementedError(
                                    "sliding-window attention: the context-parallel decode mask (local_filled_slots) takes no window"
                                )
                            # <-- MODEL-SPECIFIC: sliding window: mask prior positions before p - window + 1
                            start_pos = None
                            if self.sliding_window is not None:
                                start_pos = torch.clamp(pos_ids.to(torch.float32) - (self.sliding_window - 1), min=0)
                            mask = NF.gen_attention_decode_mask(
                                pos_ids=pos_ids.to(torch.float32),
                                start_pos=start_pos,
                                local_filled_slots=local_filled,
                            )
                            pos_ids = None
                        return NF.attention_decode(X=x, attention_mask=mask, pos_ids=pos_ids, swa_start_pos_ids=_window_start(pos_ids, self.sliding_window))
            ''',
        ),
        Example(
            title="a decode mask kept for the next layers is kept per window",
            params={"layers": "per_layer"},
            before="""
                class LlamaAttention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.scaling = config.head_dim**-0.5
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, self.qkv_size))

                    def forward_prefill(self, q, k, v):
                        return NF.flash_attention(q, k, v, scale=self.scaling)

                    def forward_decode(self, x, pos_ids, meta):
                        mask = meta.get(_MASK_KEY)
                        if mask is None:
                            mask = NF.gen_attention_decode_mask(pos_ids=pos_ids, start_pos=None)
                            meta[_MASK_KEY] = mask
                        return NF.attention_decode(X=x, attention_mask=mask)
            """,
            after='''
                def _layer_sliding_window(config, layer_idx: int) -> int | None:
                    """The attention window of one layer in tokens, or None for full attention.

                    ``config.layer_types`` marks each layer "sliding_attention" or
                    "full_attention"; a config without it does not say which layers slide.
                    """
                    if config.sliding_window is None or not config.use_sliding_window:
                        return None
                    if config.layer_types is not None:
                        if config.layer_types[layer_idx] == "sliding_attention":
                            return config.sliding_window
                        return None
                    raise ValueError("the config sets sliding_window but no layer_types")


                class LlamaAttention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.scaling = config.head_dim**-0.5
                        # <-- MODEL-SPECIFIC: sliding-window attention (window in tokens, None: full attention)
                        self.sliding_window = _layer_sliding_window(config, layer_idx)
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, self.qkv_size))

                    def forward_prefill(self, q, k, v):
                        return NF.flash_attention(q, k, v, scale=self.scaling, sliding_window=self.sliding_window)

                    def forward_decode(self, x, pos_ids, meta):
                        mask = meta.get((_MASK_KEY, self.sliding_window))
                        if mask is None:
                            # <-- MODEL-SPECIFIC: sliding window: mask prior positions before p - window + 1
                            start_pos = None
                            if self.sliding_window is not None:
                                start_pos = torch.clamp(pos_ids - (self.sliding_window - 1), min=0)
                            mask = NF.gen_attention_decode_mask(pos_ids=pos_ids, start_pos=start_pos)
                            meta[(_MASK_KEY, self.sliding_window)] = mask
                        return NF.attention_decode(X=x, attention_mask=mask)
            ''',
        ),
        Example(
            title="the layers marked in layer_types slide; Qwen2 configs without them use max_window_layers",
            params={"layers": "per_layer", "without_layer_types": "max_window_layers"},
            before="""
                def _is_prefill(attn_metadata):
                    return attn_metadata is not None


                class Qwen2Attention(nn.Module):
                    def __init__(self, cfg, index):
                        self.scaling = self.head_dim**-0.5
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, self.qkv_size))

                    def forward_prefill(self, q, k, v):
                        return NF.flash_attention(q, k, v, scale=self.scaling)

                    def forward_decode(self, x, positions):
                        mask = NF.gen_attention_decode_mask(pos_ids=positions, bs=1)
                        return NF.attention_decode(X=x, attention_mask=mask)

                    def get_kv_spec(self):
                        return LayerSpec(name=self.layer_name, num_kv_heads=1)
            """,
            after='''
                def _is_prefill(attn_metadata):
                    return attn_metadata is not None


                def _layer_sliding_window(config, layer_idx: int) -> int | None:
                    """The attention window of one layer in tokens, or None for full attention.

                    ``config.layer_types`` marks each layer "sliding_attention" or
                    "full_attention"; without it, the layers from ``max_window_layers`` on slide.
                    """
                    if config.sliding_window is None or not config.use_sliding_window:
                        return None
                    if config.layer_types is not None:
                        if config.layer_types[layer_idx] == "sliding_attention":
                            return config.sliding_window
                        return None
                    if layer_idx >= config.max_window_layers:
                        return config.sliding_window
                    return None


                class Qwen2Attention(nn.Module):
                    def __init__(self, cfg, index):
                        self.scaling = self.head_dim**-0.5
                        # <-- MODEL-SPECIFIC: sliding-window attention (window in tokens, None: full attention)
                        self.sliding_window = _layer_sliding_window(cfg, index)
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, self.qkv_size))

                    def forward_prefill(self, q, k, v):
                        return NF.flash_attention(q, k, v, scale=self.scaling, sliding_window=self.sliding_window)

                    def forward_decode(self, x, positions):
                        # <-- MODEL-SPECIFIC: sliding window: mask prior positions before p - window + 1
                        start_pos = None
                        if self.sliding_window is not None:
                            start_pos = torch.clamp(positions - (self.sliding_window - 1), min=0)
                        mask = NF.gen_attention_decode_mask(pos_ids=positions, bs=1, start_pos=start_pos)
                        return NF.attention_decode(X=x, attention_mask=mask)

                    def get_kv_spec(self):
                        return LayerSpec(name=self.layer_name, num_kv_heads=1, sliding_window_size=self.sliding_window)
            ''',
        ),
        Example(
            title="the config fields",
            role="config",
            path="config.py",
            params={"layers": "per_layer"},
            before="""
                @dataclass
                class LlamaConfig:
                    hidden_size: int = 4096
                    rope_scaling: dict[str, Any] | None = None
                    tie_word_embeddings: bool = False
                    torch_dtype: torch.dtype = torch.bfloat16
            """,
            after="""
                @dataclass
                class LlamaConfig:
                    hidden_size: int = 4096
                    rope_scaling: dict[str, Any] | None = None
                    tie_word_embeddings: bool = False
                    # <-- MODEL-SPECIFIC: fields of this architecture's features (sorted by name)
                    layer_types: list[str] | None = None
                    # attention window in tokens (None: full attention)
                    sliding_window: int | None = None
                    use_sliding_window: bool = True
                    torch_dtype: torch.dtype = torch.bfloat16
            """,
        ),
        Example(
            title="a decode path without the mask op",
            params={"layers": "all"},
            before="""
                class LlamaAttention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, self.qkv_size))

                    def forward_prefill(self, q, k, v):
                        return NF.flash_attention(q, k, v)

                    def forward_decode(self, x):
                        return NF.attention_decode(X=x)
            """,
            raises="no NF.gen_attention_decode_mask(...) call in LlamaAttention.forward_decode",
        ),
    )

    @classmethod
    def params_for(cls, diffs, target, port: PortContext) -> SlidingWindowParams:
        attention = target.attention
        if attention.sliding_window != "per_layer":
            return SlidingWindowParams(layers="all")
        return SlidingWindowParams(
            layers="per_layer",
            layer_types_key=attention.layer_types_key,
            sliding_layer_type=attention.sliding_layer_type,
        )

    # -- files -----------------------------------------------------------------------

    def transform_module(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        if ctx.role == "config":
            fields = list(CONFIG_FIELDS)
            if self.params.layers == "per_layer":
                fields += [(f"{self.params.layer_types_key}: list[str] | None = None", "")]
                if self.params.without_layer_types == "max_window_layers":
                    fields += MAX_WINDOW_FIELD
            return add_config_fields(module, ctx, fields)
        edits: dict = {}
        self._decodes = DecodeMasks()
        attention = attention_classes_in(module, ctx)
        for cls in attention:
            self._attention_edits(cls, module, ctx, edits)
        if self._decodes.outside:
            self._backbone_mask_edits(module, attention, ctx, edits)
        self._kv_spec_edits(module, ctx, edits)
        module = rewrite(module, edits)
        if self.params.layers == "all":
            module = drop_unused_function(module, "_layer_sliding_window")
        functions = [WINDOW_START] if self._decodes.start_function else []
        if self.params.layers == "per_layer" and attention:
            params = self.params
            functions.append(
                layer_function(params.without_layer_types, params.layer_types_key, params.sliding_layer_type)
            )
        return add_functions(module, functions, replace=True) if functions else module

    def _attention_edits(self, cls: cst.ClassDef, module: cst.Module, ctx: FileContext, edits: dict) -> None:
        name = cls.name.value
        init = require_method(module, ctx, cls, "__init__")
        self._init_edit(cls, init, module, ctx, edits)
        sites = kernel_sites(cls)
        for kind in (FLASH, DECODE):
            if not any(site.kind == kind for site in sites):
                raise ctx.precondition(f"{ID}: no {KERNEL_NAMES[kind]}(...) call in {name}", cls, module)
        window = parse_expr("self.sliding_window", module)
        for site in sites:
            if site.kind in (FLASH, SEGMENTED):
                edits[id(site.call)] = lambda updated: set_keyword(
                    updated, "sliding_window", window, after=("scale",)
                )
            if site.kind == SEGMENTED:
                self._whole_blocks_guard(site, cls, module, ctx, edits)
            elif site.kind == SEGMENTED_CP:
                guard(module, ctx, site, "self.sliding_window is not None", CP_MESSAGE, edits, GUARD_COMMENT)
            elif site.kind == DECODE:
                decode_mask_start_edits(
                    site, cls, module, ctx, edits, self._decodes, ID, MASK, _memoized_mask_edits
                )

    def _init_edit(self, cls, init, module, ctx, edits) -> None:
        """``self.sliding_window``: the layer's window, or None."""
        params = [p.name.value for p in init.params.params]
        if len(params) < 3:
            raise ctx.precondition(
                f"{ID}: {cls.name.value}.__init__ must take (self, config, layer_idx)", init, module
            )
        config, layer_idx = params[1], params[2]
        if self.params.layers == "all":
            value = f"{config}.sliding_window if {config}.use_sliding_window else None"
        else:
            value = f"_layer_sliding_window({config}, {layer_idx})"
        stmt = with_comment(
            parse_statement(f"self.sliding_window = {value}", module),
            "<-- MODEL-SPECIFIC: sliding-window attention (window in tokens, None: full attention)",
        )
        existing = find_self_assignment(init, "sliding_window")
        if existing is not None:
            # another rule already set: take this one (a reference may slide per layer)
            if code_of(existing.body[0].value) != value:
                edits[id(existing)] = lambda updated, stmt=stmt: stmt.with_changes(
                    leading_lines=updated.leading_lines
                )
        elif not place_setting(init, "sliding_window", stmt, edits):
            body = list(statements(init))
            start = 1 if body and _is_super_call(body[0]) else 0
            if start >= len(body):
                raise ctx.precondition(f"{ID}: {cls.name.value}.__init__ has no statements", init, module)
            edits[id(body[start])] = lambda updated, stmt=stmt: cst.FlattenSentinel([stmt, updated])

    def _whole_blocks_guard(self, site: KernelSite, cls, module, ctx, edits) -> None:
        """The segmented kernel masks a window of whole cache blocks only."""
        block = argument(site.call, "block_size", 5)
        if block is None:
            raise ctx.precondition(
                f"{ID}: {site.where(cls)}: NF.segmented_attention(...) has no block_size argument",
                site.call,
                module,
            )
        condition = f"self.sliding_window is not None and self.sliding_window % {code_of(block)} != 0"
        guard_statement(module, ctx, site.method, site.call, condition, BLOCKS_MESSAGE, edits, GUARD_COMMENT)

    def _backbone_mask_edits(self, module, attention, ctx, edits) -> None:
        """Decode masks handed to the attention by its caller: the backbone's
        mask built once per step becomes one per window
        (``autoport_cst.transform.edit.backbone_masks``); a mask already built
        with a window is left alone."""
        caller_mask_edits(module, ctx, attention, self._decodes.outside[0].method, ID, edits, MASK)

    def _kv_spec_edits(self, module: cst.Module, ctx: FileContext, edits: dict) -> None:
        specs = [n for n in nodes_of(module, cst.Call) if dotted(n.func) == "LayerSpec"]
        lm = any(isinstance(c, cst.ClassDef) and class_role(c.name.value) == "causal_lm" for c in module.body)
        if not specs and lm:
            raise ctx.precondition(f"{ID}: no LayerSpec(...) in the KV-cache spec of this file")
        for call in specs:
            current = keyword_arg(call, "sliding_window_size")
            if current is not None and not is_none(current.value):
                continue
            base = None
            for key in ("name", "num_kv_heads", "head_size"):
                arg = keyword_arg(call, key)
                text = dotted(arg.value) if arg is not None else None
                if text and "." in text:
                    base = text.rsplit(".", 1)[0]
                    break
            if base is None:
                raise ctx.precondition(
                    f"{ID}: cannot tell which attention module a LayerSpec(...) describes "
                    "(expected name=<attention>.layer_name)",
                    call,
                    module,
                )
            value = parse_expr(f"{base}.sliding_window", module)
            edits[id(call)] = lambda updated, value=value: set_keyword(updated, "sliding_window_size", value)


def _is_super_call(stmt: cst.BaseStatement) -> bool:
    return "super()" in code_of(stmt) if isinstance(stmt, cst.SimpleStatementLine) else False


def _memoized_mask_edits(mask: cst.Call, decode: cst.FunctionDef, where: str, module, ctx, edits) -> None:
    """A decode mask kept in a dict for the next layers (``meta[KEY] =
    mask`` ... ``meta.get(KEY)``) holds one layer's window: key it by the
    window too."""
    target = _assigned_name(innermost_statement(decode, mask))
    stores = (
        [
            node.targets[0].target.slice[0].slice.value
            for node in nodes_of(decode, cst.Assign)
            if len(node.targets) == 1
            and dotted(node.value) == target
            and isinstance(node.targets[0].target, cst.Subscript)
        ]
        if target
        else []
    )
    for key in stores:
        text = code_of(key)
        if "self.sliding_window" in text:
            continue
        reads = [
            n.args[0].value
            for n in walk(decode)
            if isinstance(n, cst.Call)
            and isinstance(n.func, cst.Attribute)
            and n.func.attr.value == "get"
            and n.args
            and code_of(n.args[0].value) == text
        ]
        if not reads:
            raise ctx.precondition(
                f"{ID}: {where} keeps its decode mask under {text} but does not read it back there",
                mask,
                module,
            )
        keyed = parse_expr(f"({text}, self.sliding_window)", module)
        for node in [key, *reads]:
            edits[id(node)] = lambda updated, keyed=keyed: keyed


def _assigned_name(stmt) -> str | None:
    if isinstance(stmt, cst.SimpleStatementLine) and isinstance(stmt.body[0], cst.Assign):
        return dotted(stmt.body[0].targets[0].target)
    return None
