"""attention-sinks: a learned per-head sink logit in the attention softmax (GPT-OSS)."""

from __future__ import annotations

import libcst as cst

from autoport_cst.transform import Codemod, Example, FileContext, NoParams, PortContext
from autoport_cst.transform.arguments import set_keyword
from autoport_cst.transform.attention import (
    UNFUSED_DECODE_CALL,
    UNFUSED_PREFILL_CALL,
    attention_classes,
    calls_in,
    self_parameters,
)
from autoport_cst.transform.cst_helpers import (
    dotted,
    ensure_import_from,
    insert_many_after,
    parse_expr,
    parse_statements,
    replace_string_suffix,
    rewrite,
    self_assignment,
    statements,
    walk,
    with_comment,
)
from autoport_cst.transform.layers import is_parameter, require_method
from autoport_cst.transform.mappings import entry_statement, mapping_entries

ID = "attention-sinks"
WEIGHT_LOADERS = "vllm_neuron.utils.weight_loader"

SINKS = """
self.sinks = nn.Parameter(torch.zeros(self.num_attention_heads_per_rank, dtype=torch.float32))
set_weight_loader(
    self.sinks,
    sharding_weight_loader(shard_dim=0, shard_size=self.num_attention_heads_per_rank, num_shards=self.world_size),
)
"""


class AttentionSinks(Codemod):
    """A learned sink logit per query head in the attention softmax (GPT-OSS, GraniteSWA).

    The sink is one more column in each row of the softmax, with no value: it
    only takes probability mass (GraniteSWA's ``sigmoid(logsumexp - sink)``
    output scaling is the same thing).

    Model file, attention class (``<Prefix>Attention``): ``__init__`` creates
    ``self.sinks``, this rank's heads' sinks in float32 (sharded over TP by
    query head); prefill passes ``sink=self.sinks.unsqueeze(1)`` (``[Nq, 1]``)
    to ``NF.flash_attention`` and decode the same to ``NF.attention_decode``
    (both kernels take it), or to their unfused forms. ``load_weights`` maps
    ``...self_attn.sinks`` to the checkpoint key of the same name.

    Preconditions: an attention class with ``self.num_attention_heads_per_rank``
    and ``self.world_size`` set in ``__init__`` before its parameters, the
    prefill and decode attention calls, and a ``...self_attn.o_proj_weight``
    mapping entry.
    """

    ID = ID
    REALIZES = ("attention.sinks",)
    Params = NoParams
    EXAMPLES = (
        Example(
            title="sinks on both paths",
            before="""
                from vllm_neuron.utils.weight_loader import set_weight_loader


                class GptOssAttention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, self.qkv_size))
                        self.o_proj_weight = nn.Parameter(torch.empty(self.q_size, self.hidden_size))

                    def forward_prefill(self, q, k, v):
                        return NF.flash_attention(q, k, v, scale=self.scaling)

                    def forward_decode(self, x):
                        return NF.attention_decode(X=x, softmax_scale=self.scaling)

                    def load_weights(self):
                        for layer_id in range(2):
                            prefix = f"model.layers.{layer_id}"
                            mappings[f"{prefix}.self_attn.o_proj_weight"] = f"{prefix}.self_attn.o_proj.weight"
            """,
            after="""
                from vllm_neuron.utils.weight_loader import set_weight_loader, sharding_weight_loader


                class GptOssAttention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, self.qkv_size))
                        self.o_proj_weight = nn.Parameter(torch.empty(self.q_size, self.hidden_size))
                        # <-- MODEL-SPECIFIC: a learned sink logit per query head (float32), sharded by head
                        self.sinks = nn.Parameter(torch.zeros(self.num_attention_heads_per_rank, dtype=torch.float32))
                        set_weight_loader(
                            self.sinks,
                            sharding_weight_loader(shard_dim=0, shard_size=self.num_attention_heads_per_rank, num_shards=self.world_size),
                        )

                    def forward_prefill(self, q, k, v):
                        return NF.flash_attention(q, k, v, scale=self.scaling, sink=self.sinks.unsqueeze(1))

                    def forward_decode(self, x):
                        return NF.attention_decode(X=x, softmax_scale=self.scaling, sink=self.sinks.unsqueeze(1))

                    def load_weights(self):
                        for layer_id in range(2):
                            prefix = f"model.layers.{layer_id}"
                            mappings[f"{prefix}.self_attn.o_proj_weight"] = f"{prefix}.self_attn.o_proj.weight"
                            mappings[f"{prefix}.self_attn.sinks"] = f"{prefix}.self_attn.sinks"
            """,
        ),
        Example(
            title="no decode attention call",
            before="""
                class GptOssAttention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, self.qkv_size))

                    def forward_prefill(self, q, k, v):
                        return NF.flash_attention(q, k, v)

                    def forward_decode(self, x):
                        return x
            """,
            raises="attention-sinks: no NF.attention_decode(...) call in GptOssAttention.forward_decode",
        ),
    )

    @classmethod
    def realizes(cls, diff) -> bool:
        return diff.path in cls.REALIZES and diff.target is True

    @classmethod
    def params_for(cls, diffs, target, port: PortContext) -> NoParams:
        return NoParams()

    def transform_module(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        edits: dict = {}
        sink = parse_expr("self.sinks.unsqueeze(1)", module)
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
            if "sinks" not in self_parameters(cls):
                # after the projection weights and biases, and after query/key norms
                # (whichever codemod added them first, the order is the same)
                anchor = None
                for stmt in statements(init):
                    pair = self_assignment(stmt)
                    projection = (
                        pair is not None and is_parameter(pair[1]) and pair[0].endswith(("_weight", "_bias"))
                    )
                    if projection or (anchor is not None and _mentions_qk_norm(stmt)):
                        anchor = stmt
                if anchor is None:
                    raise ctx.precondition(f"{ID}: {name}.__init__ creates no nn.Parameter", init, module)
                new = parse_statements(SINKS.strip("\n"), module)
                new[0] = with_comment(
                    new[0], "<-- MODEL-SPECIFIC: a learned sink logit per query head (float32), sharded by head"
                )
                edits[id(anchor)] = lambda updated, new=new: cst.FlattenSentinel([updated, *new])
            for call in flash + kernel:
                edits[id(call)] = lambda updated: set_keyword(
                    updated, "sink", sink, after=("sliding_window", "scale", "softmax_scale")
                )
        module = rewrite(module, edits)
        module = ensure_import_from(module, WEIGHT_LOADERS, "sharding_weight_loader")
        module = ensure_import_from(module, WEIGHT_LOADERS, "set_weight_loader")
        return self._mappings(module, ctx)

    def _mappings(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        entries = mapping_entries(module)
        keys = {e.key for e in entries}
        anchors = [e for e in entries if e.key.endswith(".self_attn.o_proj_weight")]
        if not anchors:
            raise ctx.precondition(f"{ID}: load_weights has no mappings[...self_attn.o_proj_weight] entry")
        additions = {}
        for entry in anchors:
            if entry.key[: -len("o_proj_weight")] + "sinks" in keys:
                continue
            after = next(
                (e for e in entries if e.key == entry.key[: -len("o_proj_weight")] + "k_norm.weight"), entry
            )
            key = replace_string_suffix(entry.key_node, "o_proj_weight", "sinks")
            additions[id(after.statement)] = [entry_statement(entry, key, key)]
        return insert_many_after(module, additions)


def _mentions_qk_norm(stmt: cst.BaseStatement) -> bool:
    return any(
        isinstance(n, cst.Attribute) and n.attr.value in ("q_norm", "k_norm") and dotted(n.value) == "self"
        for n in walk(stmt)
    )
