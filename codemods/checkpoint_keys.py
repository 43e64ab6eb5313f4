"""checkpoint-keys: map parameters to a checkpoint's own key names (and layouts)."""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from autoport_cst.transform import Codemod, Example, FileContext, PortContext
from autoport_cst.transform.anatomy.mappings import mapping_entries
from autoport_cst.transform.cst.roles import class_role
from autoport_cst.transform.cst.snippets import parse_expr, parse_statement
from autoport_cst.transform.cst.vocabulary import classes, classes_with_role, method, string_text
from autoport_cst.transform.edit import moe_keys, scale_keys
from autoport_cst.transform.edit.functions import add_functions
from autoport_cst.transform.edit.in_out_layouts import layout_edits
from autoport_cst.transform.edit.key_renames import (
    KeyRenamer,
    expand,
    key_literal,
    key_strings,
    mappings_statement,
    parameter_path,
    recorded_renames,
    rename_covered,
    rename_record,
    renamed_key_text,
    string_variables,
    translate_key_maps,
)
from autoport_cst.transform.edit.tree import followed_by, rewrite
from autoport_cst.transform.edit.unmapped_keys import unmapped_edits
from autoport_cst.transform.realizes import ANY, Realizes, to


@dataclass(frozen=True)
class CheckpointKeysParams:
    renames: dict[str, str] = field(
        default_factory=dict,
        metadata={
            "doc": "Dotted key patterns as the reference names them -> the checkpoint's names, matched on "
            "whole segments anywhere in a key, longest first; '*' matches one segment and is carried over "
            "(e.g. {'model': 'gpt_neox', 'self_attn.o_proj': 'attention.dense', 'mlp.up_proj': 'mlp.c_fc'}).",
            "examples": (
                {"self_attn.o_proj": "attention.dense"},
                {"model": "transformer", "norm": "ln_f"},
                {
                    "input_layernorm": "post_attention_layernorm",
                    "post_attention_layernorm": "input_layernorm",
                },
            ),
        },
    )
    in_out_params: tuple[str, ...] = field(
        default=(),
        metadata={
            "doc": "Parameter attributes whose checkpoint tensors are stored [in, out] (GPT-2 Conv1D), "
            "e.g. ['up_proj_weight', 'down_proj_weight']: their loaders stop transposing."
        },
    )
    experts: str = field(
        default="",
        metadata={
            "doc": "How the checkpoint stores the routed experts, when the renames name MoE keys: 'fused' "
            "(mlp.experts.gate_up_proj / down_proj) or 'per_expert' (mlp.experts.<j>.gate_proj ...); the "
            "reference's load-time lookup of the MoE keys (moe_checkpoint_keys) becomes these keys, and the "
            "other layout's, chosen at load, when the renames derive them."
        },
    )
    reference_renames: dict[str, str] = field(
        default_factory=dict,
        metadata={
            "doc": "The renames the reference's own load_weights records (its spec's checkpoint.key_map, "
            "canonical -> the reference's keys): that record is the reference's baseline, the renames are "
            "applied on top of it and recorded after it."
        },
    )
    in_out_layers: bool = field(
        default=False,
        metadata={
            "doc": "Every *_weight parameter of the attention and MLP classes whose loader transposes is stored "
            "[in, out] (checkpoint.linear_layout = in_out)."
        },
    )


class CheckpointKeys(Codemod):
    """Rewrite the checkpoint keys of ``load_weights`` for a checkpoint that
    names its tensors differently, and the loaders of tensors stored ``[in, out]``.

    ``renames`` maps dotted key patterns, as the reference's mapping values
    spell them, to the checkpoint's: ``{"model": "gpt_neox", "self_attn.o_proj":
    "attention.dense", "embed_tokens": "embed_in", "norm": "final_layer_norm",
    "lm_head": "embed_out"}`` turns ``f"{prefix}.self_attn.o_proj.weight"`` with
    ``prefix = f"model.layers.{layer_id}"`` into
    ``f"{checkpoint_prefix}.attention.dense.weight"``, where
    ``checkpoint_prefix = f"gpt_neox.layers.{layer_id}"`` is added next to
    ``prefix``. Patterns match whole segments (``norm`` never matches
    ``input_layernorm``), the longest pattern first, left to right; ``*``
    matches one segment and is copied to the same place in the replacement.
    Only mapping *values* (checkpoint keys) change: the keys, which are
    parameter names, stay. A parameter ``load_weights`` does not map loads
    under its own name (the real llama3's ``model.norm.weight``): when the
    renames change that name, it gets an entry after ``mappings = {}``; the
    parameters are those the file shows under the ``load_weights`` class
    (``nn.Parameter`` attributes and ``set_weight_loader(self.<m>.<p>, ...)``
    through the file's classes). One per layer without an entry is refused.

    ``in_out_params`` names parameters whose checkpoint tensors are already
    ``[in, out]`` (GPT-2 ``Conv1D``): their loaders get
    ``is_storage_transposed=False``. Transposing them anyway loads a wrong
    model that still produces fluent-looking text.

    Runs after every codemod that adds mapping entries, so that the entries
    they add are renamed too. Preconditions: a ``load_weights`` with
    ``mappings[...]`` entries; every pattern matches some checkpoint key (or
    its replacement already does: the codemod is idempotent); each
    ``in_out_params`` parameter has a transposing loader this codemod can
    read where it is built (a loader it shares, in a loop or a local
    variable, with a parameter that keeps its layout is split off). Keys of
    copies for variants (``<param>{suffix}``, the FP8 buffers) are renamed
    like their parameter's.

    The FP8 KV-cache scale keys the reference reads outside ``load_weights``
    (``f"model.layers.{layer_id}.self_attn.{scale_name}"`` for ``scale_name in
    ("k_scale", "v_scale")``) sit beside their attention module in the
    checkpoint: they take that module's checkpoint name, the leading segments
    of the renamed keys of the weights ``load_weights`` maps under it
    (``gpt_neox.layers.{layer_id}.attention`` when ``self_attn.o_proj`` becomes
    ``attention.dense``). A scale key whose module those keys do not name, or
    name two ways, or one in a file without the mappings, is refused at its
    site: a port never reads an FP8 checkpoint's scales as 1 unnoticed.

    ``in_out_layers`` does the same for every ``*_weight`` parameter of the
    attention and MLP classes (``<Prefix>Attention``, ``<Prefix>MLP``) whose
    loader transposes.

    ``experts`` (set when the renames name MoE keys): the MoE references look
    up a layer's router, experts, routing bias and shared experts at load
    time among a fixed list of names (``moe = moe_checkpoint_keys(...)``,
    ``f"{moe.router}.weight"``, ``moe.gate_up``, ``_routing_bias_key(...)``,
    ``_shared_expert_key(...)``); those become the canonical keys
    (``{prefix}.mlp.gate.weight``, ...), which the renames turn into the ones
    research read from the checkpoint's header, and the lookup statement is
    removed. The reference loads the experts fused or one tensor per expert,
    whichever the checkpoint has; so does the port: the expert weights map to
    ``[f"{prefix}.mlp.experts.gate_up_proj"] if ... in names else
    [f"{prefix}.mlp.experts.{j}.gate_proj.weight" for j in range(n)] + ...``,
    both layouts renamed by the same rule. A rename of an expert tensor
    itself (GraniteMoE's hub ``input_linear.weight`` for
    ``mlp.experts.gate_up_proj``) gives no keys for the other layout: the
    port then loads its planned layout (``experts``) only, refuses any other
    at load with an error naming the layout (``_require_expert_layout``), and
    its manifest declares only that ``checkpoint.gate_up``.

    Renames can permute names (GLM-4's ``post_attention_layernorm`` is the
    reference's ``pre_feedforward_layernorm``, and its
    ``post_self_attn_layernorm`` the reference's ``post_attention_layernorm``),
    so a renamed key cannot be told from an original one by its text: the
    codemod records the renames it applied in a comment above ``mappings =
    {}`` (``# checkpoint key renames: a -> b, ...``) and a ``load_weights``
    carrying that comment is left alone (another set of renames there is a
    precondition error).

    Realizes ``checkpoint.key_map`` (canonical Llama-style segments -> the
    checkpoint's; the renames are computed from the reference's map to the
    target's, so a reference whose own keys differ from Llama's, declared in
    its spec, is translated too) and ``checkpoint.linear_layout = in_out``
    (``in_out_layers``).
    """

    ID = "checkpoint-keys"
    REALIZES = Realizes({"checkpoint.key_map": ANY, "checkpoint.linear_layout": to("in_out")})
    Params = CheckpointKeysParams
    # every codemod that adds, removes or rewrites mapping entries
    AFTER = (
        "add-qkv-bias",
        "attention-output-gate",
        "attention-sinks",
        "dense-layers",
        "embedding-norm",
        "fused-checkpoint",
        "lm-head-bias",
        "mlp-bias",
        "mlp-kind",
        "norm-placement",
        "parallel-residual",
        "qk-norm",
        "remove-qk-norm",
        "router-bias",
        "routing-bias",
        "shared-experts",
        "swap-norm",
        "tie-embeddings",
        "weightless-qk-norm",
    )
    EXAMPLES = (
        Example(
            title="GPT-NeoX key names",
            params={
                "renames": {
                    "model": "gpt_neox",
                    "self_attn.o_proj": "attention.dense",
                    "embed_tokens": "embed_in",
                    "norm": "final_layer_norm",
                    "lm_head": "embed_out",
                }
            },
            before="""
                class LlamaForCausalLM(nn.Module):
                    def load_weights(self, path):
                        mappings = {}
                        for layer_id in range(n):
                            prefix = f"model.layers.{layer_id}"
                            mappings[f"{prefix}.input_layernorm.weight"] = f"{prefix}.input_layernorm.weight"
                            mappings[f"{prefix}.self_attn.o_proj_weight"] = f"{prefix}.self_attn.o_proj.weight"
                        mappings["model.embed_tokens.weight"] = "model.embed_tokens.weight"
                        mappings["model.norm.weight"] = "model.norm.weight"
                        if self.config.tie_word_embeddings:
                            mappings["lm_head.weight"] = "model.embed_tokens.weight"
                        else:
                            mappings["lm_head.weight"] = "lm_head.weight"
            """,
            after="""
                class LlamaForCausalLM(nn.Module):
                    def load_weights(self, path):
                        # checkpoint key renames (reference -> checkpoint):
                        #   embed_tokens -> embed_in
                        #   lm_head -> embed_out
                        #   model -> gpt_neox
                        #   norm -> final_layer_norm
                        #   self_attn.o_proj -> attention.dense
                        mappings = {}
                        for layer_id in range(n):
                            prefix = f"model.layers.{layer_id}"
                            checkpoint_prefix = f"gpt_neox.layers.{layer_id}"
                            mappings[f"{prefix}.input_layernorm.weight"] = f"{checkpoint_prefix}.input_layernorm.weight"
                            mappings[f"{prefix}.self_attn.o_proj_weight"] = f"{checkpoint_prefix}.attention.dense.weight"
                        mappings["model.embed_tokens.weight"] = "gpt_neox.embed_in.weight"
                        mappings["model.norm.weight"] = "gpt_neox.final_layer_norm.weight"
                        if self.config.tie_word_embeddings:
                            mappings["lm_head.weight"] = "gpt_neox.embed_in.weight"
                        else:
                            mappings["lm_head.weight"] = "embed_out.weight"
            """,
        ),
        Example(
            title="Conv1D checkpoints store linear weights [in, out]",
            params={"renames": {"mlp.up_proj": "mlp.c_fc"}, "in_out_params": ["up_proj_weight"]},
            before="""
                class Gpt2MLP(nn.Module):
                    def __init__(self, config):
                        set_weight_loader(
                            self.up_proj_weight,
                            sharding_weight_loader(shard_dim=1, shard_size=i, num_shards=n, is_storage_transposed=True),
                        )

                    def load_weights(self, path):
                        mappings = {}
                        mappings["mlp.up_proj_weight"] = "mlp.up_proj.weight"
            """,
            after="""
                class Gpt2MLP(nn.Module):
                    def __init__(self, config):
                        set_weight_loader(
                            self.up_proj_weight,
                            sharding_weight_loader(shard_dim=1, shard_size=i, num_shards=n, is_storage_transposed=False),
                        )

                    def load_weights(self, path):
                        # checkpoint key renames (reference -> checkpoint):
                        #   mlp.up_proj -> mlp.c_fc
                        mappings = {}
                        mappings["mlp.up_proj_weight"] = "mlp.c_fc.weight"
            """,
        ),
        Example(
            title="GLM-4: names that permute (a rename's target is another rename's source)",
            params={
                "renames": {
                    "post_attention_layernorm": "post_self_attn_layernorm",
                    "pre_feedforward_layernorm": "post_attention_layernorm",
                }
            },
            before="""
                class LlamaForCausalLM(nn.Module):
                    def load_weights(self, path):
                        mappings = {}
                        for layer_id in range(n):
                            prefix = f"model.layers.{layer_id}"
                            mappings[f"{prefix}.post_attention_layernorm.weight"] = f"{prefix}.post_attention_layernorm.weight"
                            mappings[f"{prefix}.pre_feedforward_layernorm.weight"] = f"{prefix}.pre_feedforward_layernorm.weight"
            """,
            after="""
                class LlamaForCausalLM(nn.Module):
                    def load_weights(self, path):
                        # checkpoint key renames (reference -> checkpoint):
                        #   post_attention_layernorm -> post_self_attn_layernorm
                        #   pre_feedforward_layernorm -> post_attention_layernorm
                        mappings = {}
                        for layer_id in range(n):
                            prefix = f"model.layers.{layer_id}"
                            mappings[f"{prefix}.post_attention_layernorm.weight"] = f"{prefix}.post_self_attn_layernorm.weight"
                            mappings[f"{prefix}.pre_feedforward_layernorm.weight"] = f"{prefix}.post_attention_layernorm.weight"
            """,
        ),
        Example(
            title="one of two parameters sharing a local loader stops transposing: its loader is split off",
            params={"in_out_params": ["up_proj_weight"]},
            before="""
                class Gpt2MLP(nn.Module):
                    def _setup_weight_loaders(self):
                        loader = sharding_weight_loader(shard_dim=1, shard_size=i, num_shards=n, is_storage_transposed=True)
                        loader = with_rank_override(loader, rank=self.mlp_tp_rank)
                        set_weight_loader(self.gate_proj_weight, loader)
                        set_weight_loader(self.up_proj_weight, loader)

                    def load_weights(self, checkpoint_path, device, cache_dir):
                        mappings = {}
                        mappings["mlp.up_proj_weight"] = "mlp.up_proj.weight"
            """,
            after="""
                class Gpt2MLP(nn.Module):
                    def _setup_weight_loaders(self):
                        loader = sharding_weight_loader(shard_dim=1, shard_size=i, num_shards=n, is_storage_transposed=True)
                        loader = with_rank_override(loader, rank=self.mlp_tp_rank)
                        set_weight_loader(self.gate_proj_weight, loader)
                        set_weight_loader(
                            self.up_proj_weight,
                            with_rank_override(
                                sharding_weight_loader(shard_dim=1, shard_size=i, num_shards=n, is_storage_transposed=False),
                                rank=self.mlp_tp_rank,
                            ),
                        )

                    def load_weights(self, checkpoint_path, device, cache_dir):
                        mappings = {}
                        mappings["mlp.up_proj_weight"] = "mlp.up_proj.weight"
            """,
        ),
        Example(
            title="parameters loaded under their own names (no mapping entry) get one when a rename changes their key",
            params={"renames": {"model": "gpt_neox", "embed_tokens": "embed_in", "norm": "final_layer_norm"}},
            before="""
                class LlamaModel(nn.Module):
                    def __init__(self, config):
                        self.embed_tokens = VocabDimShardedEmbedding(config.vocab_size, config.hidden_size)
                        self.norm = LlamaRMSNorm(config.hidden_size)
                        set_weight_loader(self.embed_tokens.weight, emb_loader)


                class LlamaRMSNorm(nn.Module):
                    def __init__(self, hidden_size):
                        self.weight = nn.Parameter(torch.ones(hidden_size))


                class LlamaForCausalLM(nn.Module):
                    def __init__(self, config):
                        self.model = LlamaModel(config)

                    def load_weights(self, checkpoint_path, device, cache_dir):
                        mappings = {}
                        for layer_id in range(n):
                            prefix = f"model.layers.{layer_id}"
                            mappings[f"{prefix}.self_attn.o_proj_weight"] = f"{prefix}.self_attn.o_proj.weight"
                        if self.config.tie_word_embeddings:
                            mappings["lm_head.weight"] = "model.embed_tokens.weight"
            """,
            after="""
                class LlamaModel(nn.Module):
                    def __init__(self, config):
                        self.embed_tokens = VocabDimShardedEmbedding(config.vocab_size, config.hidden_size)
                        self.norm = LlamaRMSNorm(config.hidden_size)
                        set_weight_loader(self.embed_tokens.weight, emb_loader)


                class LlamaRMSNorm(nn.Module):
                    def __init__(self, hidden_size):
                        self.weight = nn.Parameter(torch.ones(hidden_size))


                class LlamaForCausalLM(nn.Module):
                    def __init__(self, config):
                        self.model = LlamaModel(config)

                    def load_weights(self, checkpoint_path, device, cache_dir):
                        # checkpoint key renames (reference -> checkpoint):
                        #   embed_tokens -> embed_in
                        #   model -> gpt_neox
                        #   norm -> final_layer_norm
                        mappings = {}
                        # parameters the reference loads under their own names
                        mappings["model.norm.weight"] = "gpt_neox.final_layer_norm.weight"
                        mappings["model.embed_tokens.weight"] = "gpt_neox.embed_in.weight"
                        for layer_id in range(n):
                            prefix = f"model.layers.{layer_id}"
                            checkpoint_prefix = f"gpt_neox.layers.{layer_id}"
                            mappings[f"{prefix}.self_attn.o_proj_weight"] = f"{checkpoint_prefix}.self_attn.o_proj.weight"
                        if self.config.tie_word_embeddings:
                            mappings["lm_head.weight"] = "gpt_neox.embed_in.weight"
            """,
        ),
        Example(
            title="MoE keys looked up at load time among fixed names become the checkpoint's own; fused "
            "tensors renamed (GraniteMoE's hub names) give no per-expert names: that layout is refused at load",
            params={
                "renames": {
                    "mlp": "block_sparse_moe",
                    "mlp.gate": "block_sparse_moe.router.layer",
                    "mlp.experts.gate_up_proj": "block_sparse_moe.input_linear.weight",
                    "mlp.experts.down_proj": "block_sparse_moe.output_linear.weight",
                },
                "experts": "fused",
            },
            before="""
                class Qwen3MoeForCausalLM(nn.Module):
                    def load_weights(self, path):
                        names = set(checkpoint.get_tensor_names())
                        mappings = {}
                        for layer_id in range(n):
                            prefix = f"model.layers.{layer_id}"
                            moe = moe_checkpoint_keys(names, prefix, self.config.num_experts)
                            mappings[f"{prefix}.input_layernorm.weight"] = f"{prefix}.input_layernorm.weight"
                            mappings[f"{prefix}.mlp.experts.router_weight"] = f"{moe.router}.weight"
                            mappings[f"{prefix}.mlp.experts.gate_up_proj_weight"] = moe.gate_up
                            mappings[f"{prefix}.mlp.experts.down_proj_weight"] = moe.down
            """,
            after='''
                def _require_expert_layout(names, mappings, parameters: list[str], layout: str) -> None:
                    """Refuse a checkpoint whose routed experts are not stored as this port
                    loads them: its checkpoint key renames give the keys of one expert layout
                    only (``layout``, the spec's checkpoint.gate_up: "fused" tensors or
                    "separate" per-expert ones)."""
                    missing = [key for parameter in parameters for key in mappings[parameter] if key not in names]
                    if missing:
                        expected = ", ".join(mappings[parameter][0] for parameter in parameters)
                        raise KeyError(
                            f"the checkpoint does not store the routed experts as this port loads them: "
                            f"checkpoint.gate_up = {layout!r} ({expected}, ...), but it has no {missing[0]}; "
                            "the port's checkpoint key renames give the keys of no other expert layout"
                        )


                class Qwen3MoeForCausalLM(nn.Module):
                    def load_weights(self, path):
                        names = set(checkpoint.get_tensor_names())
                        # checkpoint key renames (reference -> checkpoint):
                        #   mlp -> block_sparse_moe
                        #   mlp.experts.down_proj -> block_sparse_moe.output_linear.weight
                        #   mlp.experts.gate_up_proj -> block_sparse_moe.input_linear.weight
                        #   mlp.gate -> block_sparse_moe.router.layer
                        mappings = {}
                        for layer_id in range(n):
                            prefix = f"model.layers.{layer_id}"
                            mappings[f"{prefix}.input_layernorm.weight"] = f"{prefix}.input_layernorm.weight"
                            mappings[f"{prefix}.mlp.experts.router_weight"] = f"{prefix}.block_sparse_moe.router.layer.weight"
                            mappings[f"{prefix}.mlp.experts.gate_up_proj_weight"] = [f"{prefix}.block_sparse_moe.input_linear.weight"]
                            mappings[f"{prefix}.mlp.experts.down_proj_weight"] = [f"{prefix}.block_sparse_moe.output_linear.weight"]
                            _require_expert_layout(names, mappings, [f"{prefix}.mlp.experts.gate_up_proj_weight", f"{prefix}.mlp.experts.down_proj_weight"], "fused")
            ''',
        ),
        Example(
            title="experts stored one tensor per expert, a router under a submodule, a routing bias and shared "
            "experts under other names (HY-V3)",
            params={
                "renames": {
                    "mlp.gate": "mlp.router.gate",
                    "mlp.gate.e_score_correction_bias": "mlp.expert_bias",
                    "mlp.shared_experts": "mlp.shared_mlp",
                },
                "experts": "per_expert",
            },
            before="""
                class Qwen3MoeForCausalLM(nn.Module):
                    def load_weights(self, path):
                        mappings = {}
                        for layer_id in range(n):
                            prefix = f"model.layers.{layer_id}"
                            moe = moe_checkpoint_keys(names, prefix, self.config.num_experts)
                            mappings[f"{prefix}.mlp.experts.router_weight"] = f"{moe.router}.weight"
                            mappings[f"{prefix}.mlp.experts.routing_bias"] = _routing_bias_key(names, moe.router, moe.module, "e_score_correction_bias")
                            mappings[f"{prefix}.mlp.experts.gate_up_proj_weight"] = moe.gate_up
                            mappings[f"{prefix}.mlp.experts.down_proj_weight"] = moe.down
                            mappings[f"{prefix}.mlp.experts.shared_up_proj_weight"] = _shared_expert_key(names, moe.module, "up_proj.weight")
            """,
            after="""
                class Qwen3MoeForCausalLM(nn.Module):
                    def load_weights(self, path):
                        # checkpoint key renames (reference -> checkpoint):
                        #   mlp.gate -> mlp.router.gate
                        #   mlp.gate.e_score_correction_bias -> mlp.expert_bias
                        #   mlp.shared_experts -> mlp.shared_mlp
                        mappings = {}
                        for layer_id in range(n):
                            prefix = f"model.layers.{layer_id}"
                            mappings[f"{prefix}.mlp.experts.router_weight"] = f"{prefix}.mlp.router.gate.weight"
                            mappings[f"{prefix}.mlp.experts.routing_bias"] = f"{prefix}.mlp.expert_bias"
                            mappings[f"{prefix}.mlp.experts.gate_up_proj_weight"] = ([f"{prefix}.mlp.experts.gate_up_proj"] if f"{prefix}.mlp.experts.gate_up_proj" in names else [f"{prefix}.mlp.experts.{j}.gate_proj.weight" for j in range(self.config.num_experts)] + [f"{prefix}.mlp.experts.{j}.up_proj.weight" for j in range(self.config.num_experts)])
                            mappings[f"{prefix}.mlp.experts.down_proj_weight"] = ([f"{prefix}.mlp.experts.down_proj"] if f"{prefix}.mlp.experts.down_proj" in names else [f"{prefix}.mlp.experts.{j}.down_proj.weight" for j in range(self.config.num_experts)])
                            mappings[f"{prefix}.mlp.experts.shared_up_proj_weight"] = f"{prefix}.mlp.shared_mlp.up_proj.weight"
            """,
        ),
        Example(
            title="FP8 KV-cache scales are read beside the checkpoint's attention module, whose name the "
            "renamed keys of its weights give (GPT-NeoX: self_attn -> attention)",
            params={"renames": {"model": "gpt_neox", "self_attn.o_proj": "attention.dense"}},
            before="""
                class LlamaForCausalLM(nn.Module):
                    def load_weights(self, path):
                        mappings = {}
                        for layer_id in range(n):
                            prefix = f"model.layers.{layer_id}"
                            mappings[f"{prefix}.self_attn.o_proj_weight"] = f"{prefix}.self_attn.o_proj.weight"

                    def _load_kv_cache_scales(self, checkpoint):
                        for layer_id, layer in enumerate(self.model.layers):
                            for scale_name in ("k_scale", "v_scale"):
                                key = f"model.layers.{layer_id}.self_attn.{scale_name}"
            """,
            after="""
                class LlamaForCausalLM(nn.Module):
                    def load_weights(self, path):
                        # checkpoint key renames (reference -> checkpoint):
                        #   model -> gpt_neox
                        #   self_attn.o_proj -> attention.dense
                        mappings = {}
                        for layer_id in range(n):
                            prefix = f"model.layers.{layer_id}"
                            checkpoint_prefix = f"gpt_neox.layers.{layer_id}"
                            mappings[f"{prefix}.self_attn.o_proj_weight"] = f"{checkpoint_prefix}.attention.dense.weight"

                    def _load_kv_cache_scales(self, checkpoint):
                        for layer_id, layer in enumerate(self.model.layers):
                            for scale_name in ("k_scale", "v_scale"):
                                key = f"gpt_neox.layers.{layer_id}.attention.{scale_name}"
            """,
        ),
        Example(
            title="a KV-cache scale key whose module the renamed weight keys split between two names",
            params={"renames": {"self_attn.o_proj": "attention.dense"}},
            before="""
                class LlamaForCausalLM(nn.Module):
                    def load_weights(self, path):
                        mappings = {}
                        for layer_id in range(n):
                            prefix = f"model.layers.{layer_id}"
                            mappings[f"{prefix}.self_attn.q_proj_weight"] = f"{prefix}.self_attn.q_proj.weight"
                            mappings[f"{prefix}.self_attn.o_proj_weight"] = f"{prefix}.self_attn.o_proj.weight"

                    def _load_kv_cache_scales(self, checkpoint):
                        for layer_id, layer in enumerate(self.model.layers):
                            for scale_name in ("k_scale", "v_scale"):
                                key = f"model.layers.{layer_id}.self_attn.{scale_name}"
            """,
            raises="the KV-cache scale key beside them has no one name there",
        ),
        Example(
            title="a pattern that matches no key",
            params={"renames": {"self_attn.dense": "attention.dense"}},
            before="""
                class LlamaForCausalLM(nn.Module):
                    def load_weights(self, path):
                        mappings = {}
                        mappings["model.norm.weight"] = "model.norm.weight"
            """,
            raises="no checkpoint key of load_weights",
        ),
    )

    @classmethod
    def check_params(cls, params: CheckpointKeysParams) -> list[str]:
        problems = []
        if not params.renames and not params.in_out_params and not params.in_out_layers:
            problems.append("nothing to do: give renames, in_out_params or in_out_layers")
        if params.experts not in ("", "fused", "per_expert"):
            problems.append(f"experts {params.experts!r}: one of '', 'fused', 'per_expert'")
        for old, new in params.renames.items():
            if not old or not new or "" in old.split(".") or "" in new.split("."):
                problems.append(f"rename {old!r} -> {new!r}: patterns are non-empty dotted names")
            elif old.split(".").count("*") != new.split(".").count("*"):
                problems.append(f"rename {old!r} -> {new!r}: both sides need the same number of '*'")
        return problems

    @classmethod
    def params_for(cls, diffs, target, port: PortContext) -> CheckpointKeysParams:
        reference_map: dict[str, str] = {}
        for diff in diffs:
            if diff.path == "checkpoint.key_map":
                reference_map = dict(diff.reference or {})
        renames = translate_key_maps(reference_map, dict(target.checkpoint.key_map or {}))
        moe = target.moe is not None and any(old == "mlp" or old.startswith("mlp.") for old in renames)
        return CheckpointKeysParams(
            renames=renames,
            reference_renames=reference_map,
            experts=("per_expert" if target.checkpoint.gate_up == "separate" else "fused") if moe else "",
            in_out_layers=target.checkpoint.linear_layout == "in_out",
        )

    def transform_module(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        loads = [m for c in classes(module) if (m := method(c, "load_weights")) is not None]
        entries = [e for fn in loads for e in mapping_entries(fn)]
        if not entries and (
            classes_with_role(module, "causal_lm") or not self._layers_elsewhere(module, ctx)
        ):
            raise ctx.precondition(
                f"{self.ID}: no load_weights with mappings[...] = ... entries in this file"
            )
        edits: dict = {}
        sites = scale_keys.scale_sites_in(module) if self.params.renames and not entries else []
        if sites:
            raise ctx.precondition(
                f"{self.ID}: a KV-cache scale key ({sites[0][1]}) in a file without load_weights' mappings: "
                "the renamed weight keys that name its module in the checkpoint are elsewhere",
                sites[0][0],
                module,
            )
        if self.params.experts and entries:
            module, loads = self._static_moe_keys(module, loads, ctx)
        if self.params.renames and entries:
            edits.update(self._rename_edits(module, loads, ctx))
        if self.params.in_out_params or self.params.in_out_layers:
            elsewhere = self._layers_elsewhere(module, ctx)
            edits.update(
                layout_edits(
                    self.ID, self.params.in_out_params, self.params.in_out_layers, elsewhere, module, ctx
                )
            )
        return rewrite(module, edits)

    @staticmethod
    def _layers_elsewhere(module: cst.Module, ctx: FileContext) -> bool:
        """A file of layer classes only (the FP8 attention and MLP of the real
        llama3), in a package whose causal LM class is in another file."""
        here = {c.name.value for c in classes(module)}
        return any(class_role(name) == "causal_lm" for name in ctx.port.package_classes - here)

    # -- key renames -------------------------------------------------------------

    def _static_moe_keys(self, module: cst.Module, loads: list[cst.FunctionDef], ctx: FileContext):
        """The load-time MoE key lookups become the canonical keys of both
        expert layouts, for the renames to turn into the checkpoint's
        (``autoport_cst.transform.edit.moe_keys``); when the renames give the
        planned layout's names only, the port loads that layout, refuses any
        other at load and declares only it (``checkpoint.gate_up``)."""
        renamer = KeyRenamer(self.params.renames)
        edits: dict = {}
        only: set[str] = set()
        for fn in loads:
            try:
                found = moe_keys.static_values(fn, module, self.params.experts == "per_expert", renamer)
            except ValueError as error:
                raise ctx.precondition(f"{self.ID}: {error}", getattr(error, "node", fn), module) from None
            edits.update(found.edits)
            only |= {found.only_layout} - {""}
        if not edits:
            return module, loads
        module = rewrite(module, edits)
        if only:
            module = add_functions(module, [moe_keys.LAYOUT_CHECK_CODE])
            ctx.narrow("checkpoint.gate_up", sorted(only))
        return module, [m for c in classes(module) if (m := method(c, "load_weights")) is not None]

    def _rename_edits(self, module: cst.Module, loads: list[cst.FunctionDef], ctx: FileContext) -> dict:
        renamer = KeyRenamer(self.params.renames)
        edits: dict = {}
        matched: set[str] = set()
        applied = [self._rename_in(fn, renamer, matched, module, ctx, edits) for fn in loads]
        unmatched = [old for old in self.params.renames if not rename_covered(old, matched)]
        if unmatched:
            raise ctx.precondition(
                f"{self.ID}: rename pattern(s) {', '.join(repr(p) for p in unmatched)} match(es) no checkpoint "
                "key of load_weights (patterns match whole dotted segments of the reference's keys; renames "
                "written for another reference's keys do not carry over, the spec's checkpoint.key_map does)"
            )
        if any(applied):
            edits.update(self._scale_key_edits(module, loads, renamer, ctx))
        return edits

    def _scale_key_edits(
        self, module: cst.Module, loads: list[cst.FunctionDef], renamer: KeyRenamer, ctx: FileContext
    ) -> dict:
        """The FP8 KV-cache scale keys (``k_scale`` / ``v_scale``, read beside
        each attention module, outside the mappings) take the checkpoint's name
        of their module, read off the renamed weight keys under it
        (``autoport_cst.transform.edit.scale_keys``); a site those keys do not
        name is refused."""
        try:
            return scale_keys.scale_key_edits(module, loads, renamer)
        except scale_keys.ScaleKeyError as error:
            raise ctx.precondition(f"{self.ID}: {error}", error.node, module) from None

    def _rename_in(
        self,
        fn: cst.FunctionDef,
        renamer: KeyRenamer,
        matched: set[str],
        module: cst.Module,
        ctx: FileContext,
        edits: dict,
    ) -> bool:
        """The renames in one ``load_weights``, recorded above its ``mappings
        = {}`` (False when recorded already); the patterns its keys match are
        added to ``matched``."""
        anchor = mappings_statement(fn)
        if not self._record(anchor, module, ctx, edits):
            matched |= set(self.params.renames)
            return False
        variables, assignments = string_variables(fn)
        derived: dict[str, str] = {}  # variable -> checkpoint variable name

        def replace(node: cst.BaseExpression, text: str, new_full: str) -> None:
            new_text = renamed_key_text(text, new_full, variables, derived, renamer)
            new_node = parse_expr(key_literal(new_text), module)
            edits[id(node)] = lambda updated, new_node=new_node: new_node.with_changes(
                lpar=updated.lpar, rpar=updated.rpar
            )

        entries = mapping_entries(fn)
        for entry in entries:
            for node in key_strings(entry.value):
                text = string_text(node)
                if text is None:
                    continue
                full = expand(text, variables)
                matched |= renamer.matched(full)
                new_full = renamer.apply(full)
                if new_full != full:
                    replace(node, text, new_full)
        self._rename_unspelled(entries, variables, renamer, matched, replace)
        owner = next(c for c in classes(module) if method(c, "load_weights") is fn)
        matched |= unmapped_edits(self.ID, fn, owner, anchor, variables, renamer, module, ctx, edits)
        for var, checkpoint_var in derived.items():
            if checkpoint_var in variables:
                continue
            new_value = renamer.apply(variables[var])
            new_stmt = parse_statement(f"{checkpoint_var} = {key_literal(new_value)}", module)
            edits[id(assignments[var])] = followed_by(new_stmt)
        return True

    def _record(self, anchor, module: cst.Module, ctx: FileContext, edits: dict) -> bool:
        """Record the renames above ``mappings = {}`` (``anchor``); False when
        they are recorded already. Other renames recorded there than the
        reference's own are refused."""
        marker = rename_record(self.params.renames)
        recorded = recorded_renames(anchor)
        if marker in recorded:
            return False
        baseline = rename_record(self.params.reference_renames) if self.params.reference_renames else None
        others = [block for block in recorded if block != baseline]
        if others:
            raise ctx.precondition(
                f"{self.ID}: load_weights already has other checkpoint key renames "
                f"({'; '.join(line[4:] for line in others[0][1:])})",
                anchor,
                module,
            )
        if anchor is not None:
            lines = [cst.EmptyLine(comment=cst.Comment(text)) for text in marker]
            edits[id(anchor)] = lambda updated: updated.with_changes(
                leading_lines=[*updated.leading_lines, *lines]
            )
        return True

    def _rename_unspelled(
        self, entries, variables: dict[str, str], renamer: KeyRenamer, matched: set[str], replace
    ):
        """Patterns no checkpoint key spells: the reference names that tensor
        its own way (starcoder2's mlp.c_fc for the up projection). Match them
        against the parameter names, which are the canonical names in every
        reference, and give the entry the renamed parameter path."""
        missing = KeyRenamer(
            {old: new for old, new in self.params.renames.items() if not rename_covered(old, matched)}
        )
        for entry in entries:
            if not missing.rules or not isinstance(entry.value, (cst.SimpleString, cst.FormattedString)):
                continue
            canonical = parameter_path(entry.key)
            if canonical is None:
                continue
            full = expand(canonical, variables)
            hits = missing.matched(full) - renamer.matched(expand(string_text(entry.value) or "", variables))
            if not hits or missing.apply(full) == full:
                continue
            matched |= hits
            replace(entry.value, canonical, renamer.apply(full))
