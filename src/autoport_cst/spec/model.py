"""The architecture spec: a typed, versioned description of what a decoder-only
transformer computes.

Every leaf field has a *role*, which decides how a difference is realized:

- ``feature``: the code must change (a codemod) unless the reference declares
  the field config-driven (its code reads the choice from the config at run
  time), for example norm kind, biases, MLP kind.
- ``value``: a number or setting every reference reads from the config (sizes,
  head counts, eps, RoPE theta). A difference never needs a codemod.
- ``optional``: a number that may be absent (``None``), for example a logit
  softcap or a residual multiplier. Whether it is present is a feature; its
  value, when both sides have one, is a value.

Defaults describe a Llama-like model, so a hand-written spec only lists what
differs. Bump ``SPEC_VERSION`` when a field changes meaning or is removed;
adding a field with a default that keeps old specs' meaning is compatible.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

SPEC_VERSION = 1

FEATURE = "feature"
VALUE = "value"
OPTIONAL = "optional"


def feature(default: Any, doc: str) -> Any:
    return field(default=default, metadata={"role": FEATURE, "doc": doc})


def value(default: Any, doc: str) -> Any:
    return field(default=default, metadata={"role": VALUE, "doc": doc})


def optional(doc: str) -> Any:
    return field(default=None, metadata={"role": OPTIONAL, "doc": doc})


def section(factory: Any, doc: str) -> Any:
    return field(default_factory=factory, metadata={"doc": doc})


NormKind = Literal["rmsnorm", "layernorm"]
NormPlacement = Literal["pre", "post", "sandwich"]
QKNorm = Literal["none", "per_head", "full_width"]
QKNormPosition = Literal["before_rope", "after_rope"]
QKNormLayers = Literal["all", "rope"]
SlidingWindow = Literal["none", "all", "per_layer"]
RopeType = Literal["default", "llama3", "linear", "dynamic", "yarn", "longrope", "none"]
RopeStyle = Literal["rotate_half", "interleaved", "rotate_half_swapped"]
NopeRule = Literal["sliding", "sliding_or_no_window", "layer_type"]
MLPKind = Literal["gated", "plain"]
GLUForm = Literal["standard", "clamped_swiglu"]
Activation = Literal["silu", "gelu", "gelu_tanh", "relu", "relu2", "quick_gelu", "xielu"]
ParallelResidual = Literal["none", "shared_norm", "separate_norms"]
EmbeddingScale = Literal["none", "sqrt_hidden", "multiplier"]
EmbeddingScaleDtype = Literal["model", "float"]
RouterActivation = Literal["softmax", "sigmoid"]
RouterDtype = Literal["float32", "bfloat16"]
# "unknown": a layout research could not read (a split transformers makes at load that no
# other value describes); no codemod realizes it, so a plan carrying it is refused
CheckpointFusion = Literal["separate", "fused", "unknown"]
QKVLayout = Literal["separate", "fused", "fused_per_head", "fused_grouped", "fused_kv_groups", "unknown"]
# where an output gate's weights are stored: its own tensor, or fused with the queries, each head's
# query rows then its gate rows (MiniCPM5-MoE's q_gate_proj)
OutputGateLayout = Literal["separate", "fused_query_per_head"]
LinearLayout = Literal["out_in", "in_out"]
ScaleForm = Literal["multiplier", "inverse_sqrt"]
LogitsForm = Literal["divisor", "multiplier"]
AttentionKind = Literal["softmax", "differential", "latent"]
OutputGate = Literal["none", "sigmoid"]
GroupLimit = Literal["none", "sum_top2", "max"]
TemperatureLayers = Literal["all", "nope"]
ChunkedAttention = Literal["none", "per_layer"]


@dataclass(frozen=True)
class NormSpec:
    kind: NormKind = feature("rmsnorm", "RMSNorm (no mean subtraction) or LayerNorm.")
    bias: bool = feature(False, "The norm has an additive bias (LayerNorm with bias).")
    unit_offset: bool = feature(False, "The weight is applied as (1 + weight), as in Gemma's RMSNorm.")
    placement: NormPlacement = feature(
        "pre",
        "pre: norm before each sublayer; post: norm applied to the sublayer output "
        "before the residual add (OLMo 2); sandwich: both (Gemma 2).",
    )
    eps_key: str = feature("rms_norm_eps", "Name of the config field that holds the norm epsilon.")
    fixed_eps: float | None = feature(
        None,
        "The epsilon the code fixes instead of reading a config field (a literal, or the norm class's "
        "default when no eps is passed: BioGPT's and OPT's nn.LayerNorm, 1e-5); None: config.<eps_key>.",
    )
    affine: bool = feature(True, "The norm has a learned weight (False: non-parametric, as in OLMo).")
    eps: float | None = value(None, "Norm epsilon.")


@dataclass(frozen=True)
class AttentionSpec:
    num_heads: int | None = value(None, "Query heads.")
    num_kv_heads: int | None = value(None, "Key/value heads (GQA when fewer than query heads).")
    head_dim: int | None = value(None, "Per-head dimension.")
    qkv_bias: bool = feature(False, "The Q, K and V projections have biases.")
    o_bias: bool = feature(False, "The output projection has a bias.")
    qk_norm: QKNorm = feature("none", "Norm on queries and keys: per head (head_dim) or full width.")
    qk_norm_position: QKNormPosition = feature(
        "before_rope",
        "Where the q/k norms apply: to the projected queries and keys (before RoPE, Qwen3) or to the "
        "rotated ones (after RoPE, HunYuan).",
    )
    qk_norm_affine: bool = feature(
        True,
        "The q/k norms have a learned weight (False: Llama 4's x * rsqrt(mean(x^2) + eps), no weight "
        "and no checkpoint tensor).",
    )
    qk_norm_layers: QKNormLayers = feature(
        "all", "The layers with q/k norms: every layer, or the layers with RoPE only (Llama 4)."
    )
    sliding_window: SlidingWindow = feature(
        "none", "Sliding-window attention on no layer, every layer, or some layers."
    )
    sliding_window_size: int | None = value(None, "Window length in tokens.")
    layer_types: tuple[str, ...] | None = value(
        None, "Per-layer attention type (for example full_attention / sliding_attention)."
    )
    layer_types_key: str = feature(
        "layer_types",
        "The config field listing each layer's attention type, which marks the layers that slide "
        "(GPT-Neo: attention_layers).",
    )
    sliding_layer_type: str = feature(
        "sliding_attention", "The entry of that list that marks a sliding-window layer (GPT-Neo: local)."
    )
    chunked: ChunkedAttention = feature(
        "none",
        "Chunked attention: per_layer: the layers config.layer_types marks 'chunked_attention' attend "
        "only to the earlier tokens of their own chunk of config.attention_chunk_size positions (a "
        "block-diagonal causal mask, Llama 4's RoPE layers); none: no layer.",
    )
    chunk_size: int | None = value(None, "Chunked attention: chunk length in tokens.")
    sinks: bool = feature(False, "Learned attention-sink logits per head (GPT-OSS).")
    softcap: float | None = optional("tanh softcapping of attention logits (Gemma 2).")
    scale: float | None = optional(
        "Attention score scale replacing head_dim ** -0.5 (Granite attention_multiplier)."
    )
    scale_key: str | None = feature(
        None, "Config field the scale is computed from (attention_multiplier, query_pre_attn_scalar)."
    )
    scale_form: ScaleForm = feature(
        "multiplier", "How the scale follows from that field: the value itself, or value ** -0.5."
    )
    kind: AttentionKind = feature(
        "softmax",
        "softmax: one softmax(q k^T) v per head from q/k/v projections of the layer input; differential: "
        "the difference of two softmax maps (DiffLlama); latent: queries/keys/values from low-rank latent "
        "projections (multi-head latent attention, DeepSeek-V2/V3): a key/value latent and one rotated key "
        "per token, each head split into a part without position and a rotated one; its default scale is "
        "(qk_nope_head_dim + qk_rope_head_dim) ** -0.5, times mscale(factor, mscale_all_dim) ** 2 under a "
        "scaled RoPE that sets mscale_all_dim.",
    )
    output_norm: bool = feature(
        False, "A norm on the attention output before the output projection (BitNet's attn_sub_norm)."
    )
    output_gate: OutputGate = feature(
        "none",
        "A gate on the attention output before the output projection: sigmoid: the output multiplied, "
        "element by element, by the sigmoid of a bias-free projection of the layer input to every head's "
        "width (AfMoE's gate_proj); none: no gate.",
    )
    q_lora: bool = feature(
        False,
        "Latent attention: queries from a low-rank projection of the hidden state, its norm and an "
        "up-projection (q_lora_rank); False: one query projection.",
    )
    q_lora_rank: int | None = value(None, "Latent attention: width of the query latent.")
    kv_lora_rank: int | None = value(
        None, "Latent attention: width of the compressed key/value latent cached per token."
    )
    qk_nope_head_dim: int | None = value(None, "Latent attention: per-head query/key part without RoPE.")
    qk_rope_head_dim: int | None = value(
        None, "Latent attention: rotated per-head query part and the one rotated key shared by the heads."
    )
    v_head_dim: int | None = value(None, "Latent attention: per-head value size.")
    other_mixer_layers: tuple[int, ...] | None = optional(
        "Layers whose token mixer is not softmax attention (state-space, linear-attention or convolution "
        "blocks of hybrid models); null: every layer attends."
    )
    multi_query_key: str | None = feature(
        None,
        "Boolean config field that makes the attention multi-query, one key/value head whatever the "
        "config's KV head count says (gpt_bigcode's multi_query); null: the config's count.",
    )
    temperature_beta_key: str | None = feature(
        None,
        "Attention temperature (Ministral 3, Llama 4): the queries are multiplied by 1 + beta * log(1 + "
        "floor((position + temperature_offset) / floor_scale)); the config field holding beta "
        "(rope_parameters.<key> for one of config.rope_parameters); null: no temperature.",
    )
    temperature_floor_key: str | None = feature(
        None, "Attention temperature: the config field holding floor_scale (as temperature_beta_key)."
    )
    temperature_offset: float = feature(
        0.0, "Attention temperature: added to the position before the division (Llama 4: 1.0)."
    )
    temperature_layers: TemperatureLayers = feature(
        "all", "Attention temperature on every layer, or on the layers without RoPE only (Llama 4)."
    )
    temperature_rounded: bool = feature(
        False,
        "Attention temperature: the factor is cast to the queries' dtype before it multiplies them "
        "(Ministral 3); False: the product is (Llama 4).",
    )
    alibi_bias_max: float | None = feature(
        None,
        "ALiBi positions (BLOOM, MPT, Falcon-RW): each score plus slope_h * (key position - query "
        "position); the slopes 2 ** -(alibi_bias_max * i / n), i = 1..n, n the power of two at or above the "
        "head count; for a head count that is not a power of two, the slopes of the even i, then of "
        "the odd i, cut to the head count. 8 for BLOOM's and Falcon's build_alibi_tensor; MPT: the "
        "alibi_bias_max its build_mpt_alibi_tensor is called with (8); null: no ALiBi.",
    )
    alibi_scaled: bool = feature(
        False,
        "ALiBi: the bias is multiplied by the attention scale with the scores (Falcon-RW); False: added "
        "after the scale (BLOOM, MPT).",
    )


@dataclass(frozen=True)
class RopeSpec:
    type: RopeType = feature("default", "RoPE frequency variant, or none.")
    theta: float | None = value(None, "RoPE base.")
    theta_in_code: float | None = optional(
        "RoPE base written in the modeling code for a config with no RoPE fields (GPT-J and CodeGen's "
        "10000): the port's default base; null: the base is read from the config."
    )
    parameters: dict[str, Any] | None = value(
        None, "Scaling parameters of the variant (factor, original_max_position_embeddings, ...)."
    )
    partial_rotary_factor: float = feature(
        1.0, "Fraction of head_dim that is rotated; 1.0 rotates the whole head."
    )
    style: RopeStyle = feature(
        "rotate_half",
        "Pairs (i, i + d/2) (rotate_half) or adjacent pairs (interleaved); rotate_half_swapped: the pairs "
        "(i, i + d/2) turned the other way (rotate_half as cat(x2, -x1), NanoChat), the usual turn of the head "
        "with its halves swapped.",
    )
    nope_layers: tuple[int, ...] | None = optional("Layers that use no positional embedding (SmolLM3).")
    nope_rule: NopeRule | None = optional(
        "How the layers without RoPE are told apart. null: config.no_rope_layers / no_rope_layer_interval "
        "(SmolLM3); sliding: a layer rotates when config.layer_types makes it slide and config.sliding_window "
        "is set (Cohere 2, Flint); sliding_or_no_window: when it slides or the config sets no sliding window "
        "(EXAONE 4); layer_type: when it slides, whether or not a sliding window is set (AfMoE)."
    )
    layer_parameters: dict[str, Any] | None = optional(
        "RoPE type and parameters per attention layer type when they differ (Gemma 3: one base for "
        "sliding layers, another for full ones); null: one RoPE for every layer."
    )


@dataclass(frozen=True)
class MLPSpec:
    kind: MLPKind = feature("gated", "act(x W_gate) * (x W_up) W_down, or act(x W_up) W_down.")
    activation: Activation = feature("silu", "Activation function.")
    bias: bool = feature(False, "The MLP projections have biases.")
    intermediate_size: int | None = value(None, "Intermediate size of the dense MLP.")
    glu: GLUForm = feature(
        "standard",
        "How a gated MLP combines its two projections. standard: act(x W_gate) * (x W_up). clamped_swiglu "
        "(GPT-OSS): the gate clamped from above and the up projection on both sides at glu_limit, then "
        "g * sigmoid(glu_alpha * g) * (u + 1); activation is then silu, the family of that gate function.",
    )
    glu_alpha: float | None = value(
        None, "Sigmoid gain of the clamped SwiGLU's gate function (swiglu_alpha)."
    )
    glu_limit: float | None = value(None, "Clamp bound of the clamped SwiGLU (swiglu_limit).")


@dataclass(frozen=True)
class MoESpec:
    num_experts: int | None = value(None, "Routed experts.")
    top_k: int | None = value(None, "Experts per token.")
    intermediate_size: int | None = value(None, "Intermediate size of one expert.")
    shared_experts: int = feature(0, "Always-on shared experts.")
    shared_expert_gate: bool = feature(False, "A sigmoid gate scales the shared expert output.")
    router_activation: RouterActivation = feature("softmax", "Router score function.")
    router_bias: bool = feature(False, "The router projection has a bias (GPT-OSS).")
    routing_bias: bool = feature(False, "A per-expert bias added to the scores for expert selection only.")
    norm_topk_prob: bool = feature(False, "Renormalize the top-k weights to sum to 1.")
    router_dtype: RouterDtype = feature("float32", "dtype of the router weight.")
    routed_scaling_factor: float | None = optional(
        "Routed experts' output multiplied by a constant (DeepSeek-V3 routed_scaling_factor)."
    )
    dense_layers: tuple[int, ...] | None = optional(
        "Layers with a dense MLP instead of experts (first_k_dense_replace, mlp_only_layers)."
    )
    expert_input_scaling: bool = feature(
        False,
        "Each routed expert reads the token's hidden state multiplied by its router score, and the experts' "
        "outputs are summed unweighted (Llama 4); false: the experts read the hidden state and their outputs "
        "are weighted by the scores.",
    )
    group_limit: GroupLimit = feature(
        "none",
        "Group-limited routing (n_group, topk_group): the top-k experts chosen among the topk_group best of "
        "n_group equal groups, a group scored by the sum of its two best selection scores (sum_top2, "
        "DeepSeek-V3) or by its best one (max, DeepSeek-V2's group_limited_greedy); none: a plain top-k.",
    )


@dataclass(frozen=True)
class EmbeddingSpec:
    vocab_size: int | None = value(None, "Vocabulary size.")
    tied: bool = feature(False, "The LM head reuses the embedding matrix.")
    scale: EmbeddingScale = feature(
        "none",
        "Embeddings multiplied by sqrt(hidden_size) (Gemma), or by the embedding multiplier inside the "
        "embedding module (multiplier: MiniCPM3).",
    )
    scale_dtype: EmbeddingScaleDtype = feature(
        "model",
        "How the sqrt(hidden_size) scale is multiplied in. model: made a tensor of the activations' dtype "
        "first, so a bfloat16 model multiplies by it rounded to bfloat16 (Gemma: sqrt(3072) = 55.43 becomes "
        "55.5); float: a Python float multiplied into the tensor, unrounded (XGLM, BioGPT).",
    )
    multiplier: float | None = optional("Constant embedding multiplier (Granite).")
    learned_positions: bool = feature(
        False,
        "Learned absolute position embeddings (or other extra embeddings) added to the token embeddings.",
    )
    positions_key: str | None = value(
        None, "Config field holding the number of learned positions (n_positions, max_position_embeddings)."
    )
    positions_offset: int = value(
        0,
        "Rows of the learned or sinusoidal position table before position 0 (OPT and BioGPT: 2; XGLM's "
        "sinusoidal table: 2).",
    )
    sinusoidal_positions: bool = feature(
        False,
        "Fixed sinusoidal positions added to the token embeddings (XGLM): row position + positions_offset of "
        "the table whose row p is [sin(p * f_i), cos(p * f_i)] for i < hidden_size // 2, f_i = "
        "exp(-i * log(positions_base) / (hidden_size // 2 - 1)) (a zero column for an odd width), the row "
        "config.<positions_padding_key> zero; computed, not loaded.",
    )
    positions_base: float | None = value(None, "Base of the sinusoidal positions' frequencies (XGLM: 10000).")
    positions_padding_key: str | None = value(
        None,
        "Config field of the sinusoidal table's row set to zero (XGLM: pad_token_id); None: no such row.",
    )
    norm: bool = feature(
        False,
        "The token embeddings pass through a norm of the layers' kind (norm.kind, bias, affine, epsilon) "
        "before the first layer (BLOOM's word_embeddings_layernorm, NanoChat's norm); its weights under "
        "model.embed_norm.",
    )


@dataclass(frozen=True)
class LMHeadSpec:
    bias: bool = feature(False, "The LM head has a bias.")
    softcap: float | None = optional("tanh softcapping of the final logits (Gemma 2).")
    logits_divisor: float | None = optional("Logits divided by a constant (Granite logits_scaling).")
    logits_key: str | None = feature(
        None, "Config field the logits are rescaled by (logits_scaling, logit_scale); null: none or unknown."
    )
    logits_form: LogitsForm = feature(
        "divisor",
        "How that field applies: logits divided by it (Granite), or multiplied by it (Cohere's logit_scale; "
        "logits_divisor is then its reciprocal).",
    )


@dataclass(frozen=True)
class ResidualSpec:
    parallel: ParallelResidual = feature(
        "none",
        "Attention and MLP read the same input and are summed: with one shared norm "
        "(GPT-J, Phi) or separate norms (GPT-NeoX).",
    )
    multiplier: float | None = optional("Sublayer outputs scaled before the residual add (Granite).")


@dataclass(frozen=True)
class CheckpointSpec:
    qkv: QKVLayout = feature(
        "separate",
        "Q, K and V stored as separate q/k/v tensors, as one fused [q | k | v] tensor, fused per "
        "head ([h0: q k v, h1: q k v, ...], GPT-NeoX), or fused in groups (qkv_groups equal groups of "
        "rows, each its share of q, k and v in the order qkv_order: CodeGen's four [q v k]), or fused in "
        "a group per KV head (its query heads, its key head, its value head: Falcon-40B's new decoder "
        "architecture); unknown: "
        "stored in a layout research could not read (refused).",
    )
    qkv_groups: int | None = optional(
        "fused_grouped: the number of groups of rows of the fused tensor (CodeGen: 4, the model-parallel "
        "shards it was trained with, whatever the config)."
    )
    qkv_order: str | None = optional(
        "fused_grouped: the order of the query, key and value rows in each group ('qvk': CodeGen)."
    )
    gate_up: CheckpointFusion = feature(
        "separate",
        "Gate and up projections stored separately, or as one fused gate_up tensor; unknown: stored in a "
        "layout research could not read (refused).",
    )
    output_gate: OutputGateLayout = feature(
        "separate",
        "The attention output gate (attention.output_gate) stored as its own tensor, or fused with the "
        "queries in one tensor whose rows are, head after head, the head's query rows then its gate rows "
        "(fused_query_per_head: MiniCPM5-MoE's q_gate_proj).",
    )
    lm_head_stored: bool | None = value(
        None, "Whether the checkpoint stores lm_head.weight (tied models usually do not)."
    )
    key_map: dict[str, str] | None = feature(
        None,
        "Key segments of this checkpoint that differ from the Llama-style names, canonical -> "
        "checkpoint ({'model': 'gpt_neox', 'self_attn.o_proj': 'attention.dense'}); null: Llama-style.",
    )
    linear_layout: LinearLayout = feature(
        "out_in", "Linear weights stored [out, in] (torch nn.Linear) or [in, out] (GPT-2 Conv1D)."
    )
    config_keys: dict[str, str] | None = feature(
        None,
        "Config fields a port reads that this model's config.json writes under other names, port field -> "
        "where to read it: a config.json key (transformers' attribute_map: hidden_size -> n_embd), or "
        "'<key> or <expression>' / '<expression>', arithmetic of config.json keys and integers for a "
        "value the code computes when the config leaves it unset (GPT-J's intermediate_size 'n_inner or "
        "4 * n_embd', partial_rotary_factor 'rotary_dim / (n_embd // n_head)'); null: the port's names.",
    )


VisionNorm = Literal["layernorm", "rmsnorm"]
VisionPositions = Literal["rope_2d", "learned_and_rope_2d"]
VisionAttention = Literal["full", "window"]


@dataclass(frozen=True)
class VisionSpec:
    """The vision tower of a vision-language model and how its output meets the text decoder."""

    patch_size: int | None = value(None, "Side of a square image patch in pixels.")
    temporal_patch_size: int | None = value(None, "Frames stacked into one patch (a still image repeated).")
    spatial_merge_size: int | None = value(
        None, "Side of the square of neighbouring patches the merger folds into one token."
    )
    depth: int | None = value(None, "Transformer blocks of the tower.")
    hidden_size: int | None = value(None, "Width of the tower.")
    num_heads: int | None = value(None, "Attention heads of the tower.")
    intermediate_size: int | None = value(None, "Intermediate size of a tower block's MLP.")
    out_hidden_size: int | None = value(None, "Width of the merged tokens (the text decoder's width).")
    norm: VisionNorm = feature("layernorm", "The tower blocks' norm: LayerNorm (mean subtracted) or RMSNorm.")
    norm_bias: bool = feature(True, "An additive bias in the tower blocks' norms.")
    mlp_kind: MLPKind = feature("plain", "The tower blocks' MLP: plain act(x W_up) W_down, or gated.")
    activation: Activation = feature("gelu_tanh", "The tower blocks' MLP activation.")
    patch_bias: bool = feature(True, "A bias in the patch embedding (a 3-D convolution).")
    positions: VisionPositions = feature(
        "learned_and_rope_2d",
        "The tower's positions: 2-D rotary (row, column) in its attention only (rope_2d), or also a learned "
        "table resampled to each image's grid and added to the patch embeddings (learned_and_rope_2d).",
    )
    attention: VisionAttention = feature(
        "full",
        "The tower's attention: full (every patch of an image attends to all of them) or window attention "
        "(most blocks attend within windows of merged patches, full_attention_blocks to the whole image: "
        "Qwen2.5-VL).",
    )
    window_size: int | None = value(None, "Window attention: the window's side in pixels.")
    full_attention_blocks: tuple[int, ...] | None = value(
        None, "Window attention: the blocks that attend to the whole image."
    )
    merger_norm: VisionNorm = feature(
        "layernorm", "The patch merger's norm on each patch before folding: LayerNorm or RMSNorm."
    )
    merger_activation: Activation = feature("gelu", "The patch merger's activation between its projections.")
    deepstack: bool = feature(
        False,
        "Deep-stack features: merged outputs of some tower blocks (deepstack_layers) added to the hidden "
        "states of the first decoder layers (Qwen3-VL); False: only the last block's output is merged.",
    )
    deepstack_layers: tuple[int, ...] | None = value(
        None, "Deep-stack: the tower blocks whose output is merged."
    )
    mrope_section: tuple[int, ...] | None = value(
        None, "M-RoPE: rotary frequency pairs given to the temporal, height and width positions."
    )
    mrope_interleaved: bool = feature(
        True,
        "The M-RoPE frequency layout: interleaved, the temporal, height and width positions in turn (true: "
        "Qwen3-VL), or contiguous sections, all temporal, then height, then width (false: Qwen2-VL, "
        "Qwen2.5-VL).",
    )
    text_prefix: str | None = feature(
        None, "Checkpoint key prefix of the text decoder's tensors (model.language_model)."
    )
    tower_prefix: str | None = feature(None, "Checkpoint key prefix of the tower's tensors (model.visual).")
    module_names: dict[str, str] | None = feature(
        None,
        "Checkpoint names of the tower's projections and norms by role (under a block: mlp_up, mlp_down; "
        "under the tower: merger_norm, merger_fc1, merger_fc2), read from the modules: Qwen3-VL's "
        "mlp.linear_fc1 and merger.norm, Qwen2-VL's mlp.fc1 and merger.ln_q, merger.mlp.0; null: unknown.",
    )
    config_keys: dict[str, str] | None = feature(
        None,
        "vision_config keys the port's tower fields are read from where the config writes them under other "
        "names, port field -> a key or '<key> * <key>' (Qwen2-VL: hidden_size 'embed_dim', out_hidden_size "
        "'hidden_size', intermediate_size 'embed_dim * mlp_ratio'); null: the port's names.",
    )


@dataclass(frozen=True)
class ArchSpec:
    """What a decoder-only model computes, independent of any implementation."""

    hidden_size: int | None = value(None, "Model width.")
    num_layers: int | None = value(None, "Decoder layers.")
    max_position_embeddings: int | None = value(None, "Longest supported context.")
    norm: NormSpec = section(NormSpec, "Normalization layers.")
    attention: AttentionSpec = section(AttentionSpec, "Self-attention.")
    rope: RopeSpec = section(RopeSpec, "Rotary position embedding.")
    mlp: MLPSpec = section(MLPSpec, "Dense feed-forward block.")
    moe: MoESpec | None = field(
        default=None,
        metadata={"role": FEATURE, "doc": "Mixture of experts replacing the dense MLP; null when dense."},
    )
    embedding: EmbeddingSpec = section(EmbeddingSpec, "Token embedding.")
    lm_head: LMHeadSpec = section(LMHeadSpec, "Language-model head.")
    residual: ResidualSpec = section(ResidualSpec, "Residual stream.")
    checkpoint: CheckpointSpec = section(CheckpointSpec, "How the checkpoint stores the weights.")
    vision: VisionSpec | None = field(
        default=None,
        metadata={
            "role": FEATURE,
            "doc": "The vision tower of a vision-language model (the fields above describe its text "
            "decoder); null for a text-only model.",
        },
    )
    unsupported: tuple[str, ...] | None = optional(
        "Computations of the model the fields above cannot describe, each named with its evidence (what "
        "the research could not classify); null: none. No reference realizes them, so a plan with any is "
        "refused."
    )
