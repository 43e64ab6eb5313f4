"""alibi-positions: ALiBi, a per-head linear bias on the attention scores instead of RoPE (BLOOM, MPT)."""

from __future__ import annotations

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
    KernelSite,
    attention_classes_in,
    kernel_sites,
)
from autoport_cst.transform.anatomy.classes import one_class, require_method
from autoport_cst.transform.cst.snippets import parse_expr, parse_statement
from autoport_cst.transform.cst.vocabulary import (
    classes_with_role,
    find_self_assignment,
)
from autoport_cst.transform.edit.arguments import set_keyword
from autoport_cst.transform.edit.functions import add_functions
from autoport_cst.transform.edit.kernels import ALIBI_BIAS, guard, substitutes_for, to_unfused
from autoport_cst.transform.edit.tree import followed_by, rewrite, with_comment
from autoport_cst.transform.edit.unrotated import unrotated, unrotated_backbone, without_rotary_class
from autoport_cst.transform.realizes import ANY, Realizes, not_to

ID = "alibi-positions"
ATTR = "alibi"
HEADS_PER_RANK = "num_attention_heads_per_rank"
COMMENT = "<-- MODEL-SPECIFIC: ALiBi: (heads, bias_max, this rank's first query head, its heads, scale)"
GUARD_COMMENT = "<-- MODEL-SPECIFIC: ALiBi: a path no substitute computes refuses"
CP_MESSAGE = (
    "ALiBi positions: NF.segmented_attention_cp (context-parallel prefill) has no ALiBi and no substitute"
)

SLOPES = '''
def _alibi_slopes(alibi, like):
    """ALiBi's slopes of some heads, float32 on ``like``'s device, for
    ``alibi`` = (heads, bias_max, first, count, scale): those of heads first ..
    first + count - 1 of 2 ** -(bias_max * i / n), i = 1..n, n the power of
    two at or above ``heads``; when ``heads`` is not a power of two, those of
    the even i, then of the odd i, the first ``heads`` of them (MPT's
    build_mpt_alibi_tensor; BLOOM's build_alibi_tensor: the same with bias_max
    8). Times ``scale`` (the attention scale when the bias is scaled with the
    scores: Falcon-RW). Computed in forward: the model is built on the meta
    device."""
    heads, bias_max, first, count, scale = alibi
    n = 1 << (heads - 1).bit_length()
    powers = torch.arange(1, n + 1, dtype=torch.int64, device=like.device).float() * (bias_max / n)
    slopes = 1.0 / torch.pow(2, powers)
    if n != heads:
        slopes = torch.cat([slopes[1::2], slopes[::2]])[:heads]
    return slopes[first : first + count] * scale
'''


@dataclass(frozen=True)
class AlibiPositionsParams:
    bias_max: float = field(
        default=8.0,
        metadata={"doc": "The slopes are 2 ** -(bias_max * i / n) (BLOOM: 8; MPT: alibi_bias_max)."},
    )
    scaled: bool = field(
        default=False,
        metadata={
            "doc": "The bias is multiplied by the attention scale with the scores (Falcon-RW's eager form)."
        },
    )


class AlibiPositions(Codemod):
    """ALiBi positions instead of RoPE (BLOOM, MPT): every attention path
    adds ``slope_h * (key position - query position)`` to the scores,
    computed op by op (no attention kernel takes a bias), each TP rank with
    the slopes of its own query heads.

    Each score of head h gets ``slope_h * (key position - query position)``
    after the scale (``scaled``: the bias is multiplied by the scale too, as
    in Falcon-RW's eager ``(scores + alibi) * inv_norm_factor``; Falcon-RW
    itself is refused by research, ``alibi_in_mask``: its backbone also
    folds the bias into the attention mask, so transformers' eager attention
    adds it twice and its SDPA attention once). transformers adds
    ``slope_h * key position`` (BLOOM's ``build_alibi_tensor``) or
    ``slope_h * (key position - last position)`` (MPT's
    ``build_mpt_alibi_tensor``): the same softmax, each query's row shifted
    by a constant. The slopes are
    ``2 ** -(bias_max * i / n)``, ``i = 1..n``, ``n`` the power of two at or
    above the head count; for another head count (not a power of two) the
    slopes of the even ``i``, then the odd ones, cut to the head count: MPT's
    formula, which BLOOM's gives too with ``bias_max`` 8 (to a few float32 ulps).

    Tensor parallelism: the attention's ``__init__`` keeps ``self.alibi =
    (heads, bias_max, first, count, scale)``: all ``self.num_attention_heads``
    heads, the rank's first query head and its ``num_attention_heads_per_rank``
    (from head ``(attention_dp_rank + rank * attention_dp_size) * heads per
    rank`` when the class sets the attention-DP attributes: the query shard of
    the fused QKV loader; else ``rank * heads per rank``), and 1.0 or, with
    ``scaled``, ``self.scaling``. Each kernel call computes the slopes of every
    head and keeps the rank's, ``_alibi_slopes(self.alibi, <the method's
    input>)``, on the input's device: in forward, as the model is built on the
    meta device. Keys and values shared by several query heads (GQA, MQA) are
    repeated to the query heads before the bias, which is per query head.

    The NKI attention kernels take no bias, so every path runs attention op
    by op, in the model file (``autoport_cst.transform.edit.kernels``), as
    it would on a Trainium device (plain tensor ops: correct, slower):

    - ``NF.flash_attention(...)`` becomes ``_flash_attention_unfused(...,
      alibi_slopes=<the slopes>)`` and ``NF.segmented_attention(...)``
      (chunked prefill, prefix-cache hits) ``_segmented_attention_unfused``
      with the same argument: the query and key positions are those of the
      chunk and of the cache;
    - ``NF.attention_decode(...)`` (one or several tokens per sequence: the
      speculative steps) becomes ``_attention_decode_unfused(...,
      alibi_slopes=<the slopes>, alibi_positions=positions)``: prior
      slot ``s`` of a sequence holds position ``s``, the step's tokens are at
      ``positions``; masked and bounded-gather decode alike. What it does not
      implement (FP8 caches, attention DP, decode context parallelism) it
      refuses by name;
    - ``NF.segmented_attention_cp`` (context-parallel prefill) has no
      substitute: its path raises ``NotImplementedError`` naming ALiBi.

    RoPE goes from every attention method (``autoport_cst.transform.edit.
    unrotated``: the ``cos, sin = position_embeddings`` unpacking removed,
    what is computed from it bound to None, any other use refused), the
    backbone binds ``position_embeddings = None`` instead of calling
    ``self.rotary_emb``, and the rotary class goes when nothing else uses it.

    The real-device port runs what the CPU validation runs: these functions
    are the model file's own code, and no ALiBi path calls an attention
    kernel (their stand-ins neither); the projections stay NKI kernels
    (``NF.qkv_proj``, ``NF.o_proj``).

    Preconditions: an attention class whose ``__init__`` sets
    ``self.num_attention_heads``, ``self.rank`` (and ``self.scaling`` when
    ``scaled``) and ``self.num_attention_heads_per_rank``, a prefill kernel
    call, and a decode kernel call in a method taking ``positions``.
    """

    ID = ID
    REALIZES = Realizes({"attention.alibi_bias_max": not_to(None), "attention.alibi_scaled": ANY})
    # every attention kernel call (the census stops a port that leaves one unchanged) and every RoPE site
    TOUCHES = ("attention.kernel", "rope.frequencies", "rope.application")
    Params = AlibiPositionsParams
    NEEDS_REAL_MODEL = True
    PITFALLS = (
        Pitfall(
            96,
            lambda spec, facts: spec.attention.alibi_bias_max is not None,
            lambda spec, facts: (
                f"ALiBi positions (slopes 2 ** -({spec.attention.alibi_bias_max:g} * i / n)): every attention "
                "path must add slope * (key position - query position) to the scores, with each rank's "
                "slopes for its own heads; no RoPE"
            ),
        ),
    )
    # after the codemods whose kernel calls and RoPE sites it edits
    AFTER = (
        "qk-norm",
        "attention-softcap",
        "attention-sinks",
        "sliding-window",
        "position-scaled-attention",
        "chunked-attention",
        "attention-output-gate",
        "rope-scaling",
        "lazy-rope",
        "partial-rotary",
        "interleaved-rope",
        "nope-layers",
        "rope-layer-parameters",
        "qk-norm-position",
        "learned-positions",
    )
    FILES = ("model",)
    EXAMPLES = (
        Example(
            title="every path with the rank's slopes, RoPE removed (shown with the op-by-op functions already in the module)",
            before="""
                def _alibi_bias(slopes, rows, distance):
                    ...


                def _alibi_slopes(alibi, like):
                    ...


                def _attention_decode_unfused(X, alibi_slopes=None, alibi_positions=None, **kernel_options):
                    ...


                def _flash_attention_unfused(q, k, v, scale=None, alibi_slopes=None, **kernel_options):
                    ...


                def _segmented_attention_unfused(q, k_cache, v_cache, alibi_slopes=None, **kernel_options):
                    ...


                def _softmax_attention(q, k, v, scale, visible, sink, softcap, tp_out, bias=None):
                    ...


                class MptAttention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.num_attention_heads = config.num_attention_heads
                        self.scaling = self.head_dim**-0.5
                        self.rank = self.tp_group.rank_in_group
                        self.attention_dp_size = neuron_config.attention_dp_size if neuron_config else 1
                        self.attention_dp_rank = get_neuron_attention_dp_rank()
                        self.num_attention_heads_per_rank = self.num_attention_heads // effective_q_shards
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, self.qkv_size))

                    def forward_prefill(self, hidden_states, positions, position_embeddings, meta):
                        cos, sin = position_embeddings
                        cos_cache = cos.unsqueeze(0)
                        sin_cache = sin.unsqueeze(0)
                        q, k, v = NF.qkv_proj(hidden=hidden_states, cos_cache=cos_cache, sin_cache=sin_cache)
                        if self.dcp_size > 1:
                            out = NF.segmented_attention_cp(q=q, k_local=k, v_local=v, scale=self.scaling)
                        elif meta["kv_segment_size"]:
                            out = NF.segmented_attention(q, k_cache=self.k_cache, v_cache=self.v_cache, scale=self.scaling)
                        else:
                            out = NF.flash_attention(q, k, v, scale=self.scaling)
                        return out

                    def forward_decode(self, hidden_states, positions, position_embeddings, mask):
                        cos, sin = position_embeddings
                        cos_kernel = cos.permute(1, 0)
                        return NF.attention_decode(X=hidden_states, cos=cos_kernel, attention_mask=mask)
            """,
            after="""
                def _alibi_bias(slopes, rows, distance):
                    ...


                def _alibi_slopes(alibi, like):
                    ...


                def _attention_decode_unfused(X, alibi_slopes=None, alibi_positions=None, **kernel_options):
                    ...


                def _flash_attention_unfused(q, k, v, scale=None, alibi_slopes=None, **kernel_options):
                    ...


                def _segmented_attention_unfused(q, k_cache, v_cache, alibi_slopes=None, **kernel_options):
                    ...


                def _softmax_attention(q, k, v, scale, visible, sink, softcap, tp_out, bias=None):
                    ...


                class MptAttention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.num_attention_heads = config.num_attention_heads
                        self.scaling = self.head_dim**-0.5
                        self.rank = self.tp_group.rank_in_group
                        self.attention_dp_size = neuron_config.attention_dp_size if neuron_config else 1
                        self.attention_dp_rank = get_neuron_attention_dp_rank()
                        self.num_attention_heads_per_rank = self.num_attention_heads // effective_q_shards
                        # <-- MODEL-SPECIFIC: ALiBi: (heads, bias_max, this rank's first query head, its heads, scale)
                        self.alibi = (self.num_attention_heads, 8.0, (self.attention_dp_rank + self.rank * self.attention_dp_size) * self.num_attention_heads_per_rank, self.num_attention_heads_per_rank, 1.0)
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, self.qkv_size))

                    def forward_prefill(self, hidden_states, positions, position_embeddings, meta):
                        cos_cache = None
                        sin_cache = None
                        q, k, v = NF.qkv_proj(hidden=hidden_states, cos_cache=cos_cache, sin_cache=sin_cache)
                        if self.dcp_size > 1:
                            # <-- MODEL-SPECIFIC: ALiBi: a path no substitute computes refuses
                            if self.alibi is not None:
                                raise NotImplementedError(
                                    "ALiBi positions: NF.segmented_attention_cp (context-parallel prefill) has no ALiBi and no substitute"
                                )
                            out = NF.segmented_attention_cp(q=q, k_local=k, v_local=v, scale=self.scaling)
                        elif meta["kv_segment_size"]:
                            out = _segmented_attention_unfused(q, k_cache=self.k_cache, v_cache=self.v_cache, scale=self.scaling, alibi_slopes=_alibi_slopes(self.alibi, hidden_states))
                        else:
                            out = _flash_attention_unfused(q, k, v, scale=self.scaling, alibi_slopes=_alibi_slopes(self.alibi, hidden_states))
                        return out

                    def forward_decode(self, hidden_states, positions, position_embeddings, mask):
                        cos_kernel = None
                        return _attention_decode_unfused(X=hidden_states, cos=cos_kernel, attention_mask=mask, alibi_slopes=_alibi_slopes(self.alibi, hidden_states), alibi_positions=positions)
            """,
        ),
        Example(
            title="the bias scaled with the scores, no attention DP (Falcon-RW); the backbone without RoPE",
            params={"scaled": True},
            before="""
                def _alibi_bias(slopes, rows, distance):
                    ...


                def _alibi_slopes(alibi, like):
                    ...


                def _attention_decode_unfused(X, alibi_slopes=None, alibi_positions=None, **kernel_options):
                    ...


                def _flash_attention_unfused(q, k, v, scale=None, alibi_slopes=None, **kernel_options):
                    ...


                def _segmented_attention_unfused(q, k_cache, v_cache, alibi_slopes=None, **kernel_options):
                    ...


                def _softmax_attention(q, k, v, scale, visible, sink, softcap, tp_out, bias=None):
                    ...


                class FalconRotaryEmbedding(nn.Module):
                    def forward(self, position_ids, device, dtype):
                        return position_ids


                class FalconAttention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.num_attention_heads = config.num_attention_heads
                        self.scaling = self.head_dim**-0.5
                        self.rank = self.tp_group.rank_in_group
                        self.num_attention_heads_per_rank = self.num_attention_heads // self.world_size
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, self.qkv_size))

                    def forward_prefill(self, hidden_states, positions, position_embeddings):
                        q, k, v = NF.qkv_proj(hidden=hidden_states)
                        return NF.flash_attention(q, k, v, scale=self.scaling)

                    def forward_decode(self, hidden_states, positions, position_embeddings):
                        return NF.attention_decode(X=hidden_states, pos_ids=positions)


                class FalconModel(nn.Module):
                    def __init__(self, config):
                        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
                        self.rotary_emb = FalconRotaryEmbedding(config)

                    def forward(self, input_ids, positions):
                        hidden_states = self.embed_tokens(input_ids)
                        position_embeddings = self.rotary_emb(positions, hidden_states.device, hidden_states.dtype)
                        return self.layers(hidden_states, positions, position_embeddings)
            """,
            after="""
                def _alibi_bias(slopes, rows, distance):
                    ...


                def _alibi_slopes(alibi, like):
                    ...


                def _attention_decode_unfused(X, alibi_slopes=None, alibi_positions=None, **kernel_options):
                    ...


                def _flash_attention_unfused(q, k, v, scale=None, alibi_slopes=None, **kernel_options):
                    ...


                def _segmented_attention_unfused(q, k_cache, v_cache, alibi_slopes=None, **kernel_options):
                    ...


                def _softmax_attention(q, k, v, scale, visible, sink, softcap, tp_out, bias=None):
                    ...


                class FalconAttention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.num_attention_heads = config.num_attention_heads
                        self.scaling = self.head_dim**-0.5
                        self.rank = self.tp_group.rank_in_group
                        self.num_attention_heads_per_rank = self.num_attention_heads // self.world_size
                        # <-- MODEL-SPECIFIC: ALiBi: (heads, bias_max, this rank's first query head, its heads, scale)
                        self.alibi = (self.num_attention_heads, 8.0, self.rank * self.num_attention_heads_per_rank, self.num_attention_heads_per_rank, self.scaling)
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, self.qkv_size))

                    def forward_prefill(self, hidden_states, positions, position_embeddings):
                        q, k, v = NF.qkv_proj(hidden=hidden_states)
                        return _flash_attention_unfused(q, k, v, scale=self.scaling, alibi_slopes=_alibi_slopes(self.alibi, hidden_states))

                    def forward_decode(self, hidden_states, positions, position_embeddings):
                        return _attention_decode_unfused(X=hidden_states, pos_ids=positions, alibi_slopes=_alibi_slopes(self.alibi, hidden_states), alibi_positions=positions)


                class FalconModel(nn.Module):
                    def __init__(self, config):
                        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)

                    def forward(self, input_ids, positions):
                        hidden_states = self.embed_tokens(input_ids)
                        # <-- MODEL-SPECIFIC: no rotary embedding (ALiBi): the attention kernels rotate nothing
                        position_embeddings = None
                        return self.layers(hidden_states, positions, position_embeddings)
            """,
        ),
        Example(
            title="no per-rank head count to slice the slopes by",
            before="""
                class MptAttention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.num_attention_heads = config.num_attention_heads
                        self.rank = self.tp_group.rank_in_group
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, self.qkv_size))

                    def forward_prefill(self, q, k, v):
                        return NF.flash_attention(q, k, v)

                    def forward_decode(self, x, positions):
                        return NF.attention_decode(X=x)
            """,
            raises=(
                "alibi-positions: MptAttention.__init__ sets no self.num_attention_heads_per_rank "
                "(the rank's query heads whose slopes it keeps)"
            ),
        ),
        Example(
            title="a decode method without the step's positions",
            before="""
                class MptAttention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.num_attention_heads = config.num_attention_heads
                        self.rank = self.tp_group.rank_in_group
                        self.num_attention_heads_per_rank = self.num_attention_heads // self.world_size
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, self.qkv_size))

                    def forward_prefill(self, q, k, v):
                        return NF.flash_attention(q, k, v)

                    def forward_decode(self, x, mask):
                        return NF.attention_decode(X=x, attention_mask=mask)
            """,
            raises="alibi-positions: MptAttention.forward_decode takes no positions (the step's query positions)",
        ),
    )

    @classmethod
    def check_params(cls, params: AlibiPositionsParams) -> list[str]:
        return [] if params.bias_max > 0 else [f"bias_max {params.bias_max!r} is not positive"]

    @classmethod
    def params_for(cls, diffs, target, port: PortContext) -> AlibiPositionsParams:
        attention = target.attention
        return AlibiPositionsParams(
            bias_max=float(attention.alibi_bias_max), scaled=bool(attention.alibi_scaled)
        )

    def transform_module(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        edits: dict = {}
        kinds: set[str] = set()
        for cls in attention_classes_in(module, ctx):
            self._attention_edits(cls, module, ctx, edits, kinds)
        if classes_with_role(module, "backbone"):  # a file of attention classes alone has none
            _backbone_edits(one_class(module, ctx, "backbone", "<Prefix>Model backbone"), module, ctx, edits)
        module = without_rotary_class(rewrite(module, edits))
        extra = [ALIBI_BIAS] if kinds & {FLASH, SEGMENTED} else []
        return add_functions(module, [SLOPES, *substitutes_for(kinds), *extra])

    def _slopes(self, init: cst.FunctionDef) -> str:
        first = f"self.rank * self.{HEADS_PER_RANK}"
        if find_self_assignment(init, "attention_dp_rank") and find_self_assignment(
            init, "attention_dp_size"
        ):
            first = f"(self.attention_dp_rank + self.rank * self.attention_dp_size) * self.{HEADS_PER_RANK}"
        scale = "self.scaling" if self.params.scaled else "1.0"
        return (
            f"self.{ATTR} = (self.num_attention_heads, {self.params.bias_max!r}, "
            f"{first}, self.{HEADS_PER_RANK}, {scale})"
        )

    def _attention_edits(
        self, cls: cst.ClassDef, module: cst.Module, ctx: FileContext, edits: dict, kinds: set[str]
    ) -> None:
        name = cls.name.value
        init = require_method(module, ctx, cls, "__init__")
        sites = kernel_sites(cls)
        if not any(site.kind in (FLASH, SEGMENTED) for site in sites):
            raise ctx.precondition(f"{ID}: no {KERNEL_NAMES[FLASH]}(...) call in {name}", cls, module)
        if not any(site.kind == DECODE for site in sites):
            raise ctx.precondition(f"{ID}: no {KERNEL_NAMES[DECODE]}(...) call in {name}", cls, module)
        if find_self_assignment(init, ATTR) is None:
            needed = (
                ("num_attention_heads", "rank", "scaling")
                if self.params.scaled
                else ("num_attention_heads", "rank")
            )
            anchor = find_self_assignment(init, HEADS_PER_RANK)
            missing = [a for a in (*needed, HEADS_PER_RANK) if not find_self_assignment(init, a)]
            if missing or anchor is None:
                raise ctx.precondition(
                    f"{ID}: {name}.__init__ sets no self.{', self.'.join(missing)} "
                    "(the rank's query heads whose slopes it keeps)",
                    init,
                    module,
                )
            stmt = with_comment(parse_statement(self._slopes(init), module), COMMENT)
            edits[id(anchor)] = followed_by(stmt)
        for site in sites:
            if site.kind == SEGMENTED_CP:
                guard(module, ctx, site, f"self.{ATTR} is not None", CP_MESSAGE, edits, GUARD_COMMENT)
                continue
            kinds.add(site.kind)
            slopes = _slopes_call(site, name, module, ctx)
            if site.kind == DECODE:
                if "positions" not in [p.name.value for p in site.method.params.params]:
                    raise ctx.precondition(
                        f"{ID}: {name}.{site.method.name.value} takes no positions (the step's query positions)",
                        site.method,
                        module,
                    )
                edits[id(site.call)] = lambda updated, slopes=slopes: set_keyword(
                    set_keyword(to_unfused(updated, DECODE), "alibi_slopes", slopes),
                    "alibi_positions",
                    cst.Name("positions"),
                )
            else:
                edits[id(site.call)] = lambda updated, kind=site.kind, slopes=slopes: set_keyword(
                    to_unfused(updated, kind), "alibi_slopes", slopes
                )
        for func in cls.body.body:
            if isinstance(func, cst.FunctionDef):
                unrotated(name, func, module, ctx, edits)


def _slopes_call(site: KernelSite, name: str, module: cst.Module, ctx: FileContext) -> cst.BaseExpression:
    """``_alibi_slopes(self.alibi, <the method's first input>)``: the slopes
    computed in forward, on the device of the method's input."""
    params = [p.name.value for p in site.method.params.params if p.name.value != "self"]
    if not params:
        raise ctx.precondition(
            f"{ID}: {name}.{site.method.name.value} takes no input to compute the slopes beside",
            site.method,
            module,
        )
    return parse_expr(f"_alibi_slopes(self.{ATTR}, {params[0]})", module)


def _backbone_edits(backbone: cst.ClassDef, module: cst.Module, ctx: FileContext, edits: dict) -> None:
    """``position_embeddings = None`` in place of ``self.rotary_emb(...)``; the
    rotary embedding's construction removed from ``__init__`` (a backbone
    already without RoPE is left as it is)."""
    forward = require_method(module, ctx, backbone, "forward")
    init = require_method(module, ctx, backbone, "__init__")
    why = "no rotary embedding (ALiBi): the attention kernels rotate nothing"
    unrotated_backbone(backbone.name.value, init, forward, module, ctx, edits, why, required=False)
