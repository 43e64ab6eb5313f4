"""embedding-multiplier: the input embeddings times a constant (Granite)."""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from autoport_cst.transform import Codemod, Example, FileContext, PortContext
from autoport_cst.transform.anatomy.classes import class_here, require_method
from autoport_cst.transform.cst.snippets import parse_statement
from autoport_cst.transform.cst.vocabulary import positional_args, self_attr, statements, walk
from autoport_cst.transform.edit.config_fields import config_scalar_edit, init_reads_config
from autoport_cst.transform.edit.layer_guards import declare_upstream, other_model_file
from autoport_cst.transform.edit.scaled_embedding import scaled_embedding
from autoport_cst.transform.edit.tree import rewrite
from autoport_cst.transform.realizes import Realizes, not_to, to


@dataclass(frozen=True)
class EmbeddingMultiplierParams:
    config_key: str = field(
        default="embedding_multiplier", metadata={"doc": "Config field holding the multiplier."}
    )
    default: float = field(default=1.0, metadata={"doc": "Its value when the config has none."})
    inside: bool = field(
        default=False,
        metadata={
            "doc": "The embedding module multiplies its own output (MiniCPM3): the backbone builds a "
            "ScaledVocabEmbedding with embed_scale=config.<config_key>, instead of multiplying before the layers."
        },
    )


class EmbeddingMultiplier(Codemod):
    """Multiply the decoder's input embeddings by a constant read from the config.

    Granite computes ``inputs_embeds * embedding_multiplier`` after the
    lookup, in the backbone (the embedding module's own output is unscaled,
    and prompt embeddings passed in are scaled too). In the backbone
    (``<Prefix>Model``): ``__init__`` gets ``self.<key> = config.<key>`` (a
    Python float); ``forward`` gets ``h = h * self.<key>`` right before the
    loop over the decoder layers, ``h`` being what the layers take. In the
    config file, the dataclass gets ``<key>: float = <default>``.

    Placed where the layers read the hidden states, the multiply follows every
    way the embeddings are built: the lookup with embedding data parallelism
    (token ids gathered, rank offsets, layout transitions) and the merge of
    prompt embeddings, which are scaled too (as transformers scales the
    ``inputs_embeds`` it is given).

    Precondition: one ``<Prefix>Model`` class taking ``config`` whose
    ``forward`` has a top-level ``for <layer> in self.<layers>:`` (or ``for
    <i>, <layer> in enumerate(self.<layers>):``) loop that calls
    ``<layer>(h, ...)``.

    With ``inside`` (the spec's ``embedding.scale`` is ``multiplier``),
    MiniCPM3's embedding module multiplies its own output by ``scale_emb``
    (prompt embeddings handed in are taken as scaled): the backbone builds
    its ``VocabDimShardedEmbedding`` as a ``ScaledVocabEmbedding`` (the
    class of embedding-scale) with ``embed_scale=config.<key>``, and the
    forward is left alone. Precondition then: one ``VocabDimShardedEmbedding``
    built in the backbone's ``__init__``.
    """

    ID = "embedding-multiplier"
    REALIZES = Realizes({"embedding.multiplier": not_to(None), "embedding.scale": to("multiplier")})
    Params = EmbeddingMultiplierParams
    FILES = ("model", "config", "module")
    EXAMPLES = (
        Example(
            title="MiniCPM3: the embedding module multiplies its output",
            params={"config_key": "embedding_multiplier", "inside": True},
            before="""
                class LlamaModel(nn.Module):
                    def __init__(self, config):
                        self.embed_tokens = VocabDimShardedEmbedding(
                            vocab_size=config.vocab_size,
                            embed_dim=config.hidden_size,
                        )
            """,
            after='''
                class ScaledVocabEmbedding(VocabDimShardedEmbedding):
                    """The vocabulary-sharded token embedding with its output multiplied by a
                    constant factor, turned into a tensor of the output's dtype first (so a
                    bfloat16 model multiplies by the factor rounded to bfloat16, as
                    transformers does)."""

                    def __init__(self, *args, embed_scale: float = 1.0, **kwargs):
                        super().__init__(*args, **kwargs)
                        self.embed_scale = embed_scale

                    def forward(self, *args, **kwargs):
                        output = super().forward(*args, **kwargs)
                        return output * output.new_tensor(self.embed_scale)


                class LlamaModel(nn.Module):
                    def __init__(self, config):
                        self.embed_tokens = ScaledVocabEmbedding(
                            vocab_size=config.vocab_size,
                            embed_dim=config.hidden_size,
                            embed_scale=config.embedding_multiplier,
                        )
            ''',
        ),
        Example(
            title="Granite",
            before="""
                class LlamaModel(nn.Module):
                    def __init__(self, config):
                        self.norm = LlamaRMSNorm(config.hidden_size, config.rms_norm_eps, config.torch_dtype)

                    def forward(self, input_ids, positions):
                        hidden_states = self.embed_tokens(input_ids)
                        position_embeddings = self.rotary_emb(positions)
                        for layer in self.layers:
                            hidden_states = layer(hidden_states, positions, position_embeddings)
                        return self.norm(hidden_states)
            """,
            after="""
                class LlamaModel(nn.Module):
                    def __init__(self, config):
                        self.norm = LlamaRMSNorm(config.hidden_size, config.rms_norm_eps, config.torch_dtype)
                        self.embedding_multiplier = config.embedding_multiplier

                    def forward(self, input_ids, positions):
                        hidden_states = self.embed_tokens(input_ids)
                        position_embeddings = self.rotary_emb(positions)
                        hidden_states = hidden_states * self.embedding_multiplier
                        for layer in self.layers:
                            hidden_states = layer(hidden_states, positions, position_embeddings)
                        return self.norm(hidden_states)
            """,
        ),
        Example(
            title="a loop that enumerates the layers",
            before="""
                class LlamaModel(nn.Module):
                    def __init__(self, config):
                        self.norm = None

                    def forward(self, input_ids, positions):
                        hidden_states = self.embed_tokens(input_ids)
                        for layer_idx, layer in enumerate(self.layers):
                            hidden_states = layer(hidden_states, positions, embeddings[layer_idx])
                        return self.norm(hidden_states)
            """,
            after="""
                class LlamaModel(nn.Module):
                    def __init__(self, config):
                        self.norm = None
                        self.embedding_multiplier = config.embedding_multiplier

                    def forward(self, input_ids, positions):
                        hidden_states = self.embed_tokens(input_ids)
                        hidden_states = hidden_states * self.embedding_multiplier
                        for layer_idx, layer in enumerate(self.layers):
                            hidden_states = layer(hidden_states, positions, embeddings[layer_idx])
                        return self.norm(hidden_states)
            """,
        ),
        Example(
            title="no loop over the layers",
            before="""
                class LlamaModel(nn.Module):
                    def __init__(self, config):
                        self.norm = None

                    def forward(self, hidden_states):
                        return self.norm(hidden_states)
            """,
            raises="no top-level for-loop over the decoder layers",
        ),
        Example(
            title="embedding data parallelism and prompt embeddings: scaled where the layers read them",
            before="""
                class LlamaModel(nn.Module):
                    def __init__(self, config):
                        self.norm = LlamaRMSNorm(config.hidden_size, config.rms_norm_eps, config.torch_dtype)

                    def forward(self, input_ids, positions, rank=None, inputs_embeds=None, is_token_ids=None):
                        if not is_prefill and self.embedding_dp_size > 1:
                            input_ids = self.embedding_dp_group.all_gather(input_ids, dim=0)
                        hidden_states = self.embed_tokens(input_ids, scatter_tokens=is_prefill, rank=rank)
                        if not is_prefill:
                            hidden_states = _dp_transition(hidden_states, self.embedding_dp_group, self.mlp_dp_group)
                        hidden_states = NF.merge_prompt_embeds(hidden_states, inputs_embeds, is_token_ids)
                        aux_hidden_states = []
                        for idx, layer in enumerate(self.layers):
                            hidden_states = layer(hidden_states, positions)
                        return self.norm(hidden_states), aux_hidden_states
            """,
            after="""
                class LlamaModel(nn.Module):
                    def __init__(self, config):
                        self.norm = LlamaRMSNorm(config.hidden_size, config.rms_norm_eps, config.torch_dtype)
                        self.embedding_multiplier = config.embedding_multiplier

                    def forward(self, input_ids, positions, rank=None, inputs_embeds=None, is_token_ids=None):
                        if not is_prefill and self.embedding_dp_size > 1:
                            input_ids = self.embedding_dp_group.all_gather(input_ids, dim=0)
                        hidden_states = self.embed_tokens(input_ids, scatter_tokens=is_prefill, rank=rank)
                        if not is_prefill:
                            hidden_states = _dp_transition(hidden_states, self.embedding_dp_group, self.mlp_dp_group)
                        hidden_states = NF.merge_prompt_embeds(hidden_states, inputs_embeds, is_token_ids)
                        aux_hidden_states = []
                        hidden_states = hidden_states * self.embedding_multiplier
                        for idx, layer in enumerate(self.layers):
                            hidden_states = layer(hidden_states, positions)
                        return self.norm(hidden_states), aux_hidden_states
            """,
        ),
    )

    @classmethod
    def params_for(cls, diffs, target, port: PortContext) -> EmbeddingMultiplierParams:
        return EmbeddingMultiplierParams(inside=target.embedding.scale == "multiplier")

    def transform_module(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        key = self.params.config_key
        if ctx.role == "config":
            return config_scalar_edit(
                module,
                ctx,
                key,
                "float",
                self.params.default,
                "<-- MODEL-SPECIFIC: input embeddings times this",
            )
        if ctx.role == "module":
            return other_model_file(module, ctx, self.touches(), "the embedding multiplier")
        if self.params.inside:
            return scaled_embedding(module, ctx, f"config.{key}")
        backbone = class_here(module, ctx, "backbone", "<Prefix>Model backbone")
        if backbone is None:
            return module
        forward = require_method(module, ctx, backbone, "forward")
        loop, hidden = None, None
        for stmt in statements(forward):
            layer = _layer_name(stmt)
            if layer is not None:
                calls = [
                    n
                    for n in walk(stmt.body)
                    if isinstance(n, cst.Call) and isinstance(n.func, cst.Name) and n.func.value == layer
                ]
                args = positional_args(calls[0]) if calls else []
                if args and isinstance(args[0].value, cst.Name):
                    loop, hidden = stmt, args[0].value.value
                    break
        if loop is None:
            raise ctx.precondition(
                f"{self.ID}: {backbone.name.value}.forward has no top-level for-loop over the decoder layers "
                "(for layer in self.layers: h = layer(h, ...))",
                forward,
                module,
            )
        edits = init_reads_config(module, ctx, backbone, key)
        already = any(isinstance(n, cst.BinaryOperation) and self_attr(n.right) == key for n in walk(forward))
        if not already:
            stmt = parse_statement(f"{hidden} = {hidden} * self.{key}", module)

            def insert(updated: cst.For) -> cst.FlattenSentinel:
                return cst.FlattenSentinel(
                    [
                        stmt.with_changes(leading_lines=updated.leading_lines),
                        updated.with_changes(leading_lines=[]),
                    ]
                )

            edits[id(loop)] = insert
        declare_upstream(
            module,
            ctx,
            "embedding.lookup",
            forward,
            loop,
            "multiplied where the decoder layers read the embeddings (after any prompt-embeds merge)",
        )
        return rewrite(module, edits)


def _layer_name(stmt: cst.BaseStatement) -> str | None:
    """``layer`` in ``for layer in self.layers:`` or ``for i, layer in enumerate(self.layers):``."""
    if not isinstance(stmt, cst.For):
        return None
    if isinstance(stmt.target, cst.Name) and self_attr(stmt.iter) is not None:
        return stmt.target.value
    if (
        isinstance(stmt.target, cst.Tuple)
        and len(stmt.target.elements) == 2
        and isinstance(stmt.target.elements[1].value, cst.Name)
        and isinstance(stmt.iter, cst.Call)
        and isinstance(stmt.iter.func, cst.Name)
        and stmt.iter.func.value == "enumerate"
        and len(stmt.iter.args) == 1
        and self_attr(stmt.iter.args[0].value) is not None
    ):
        return stmt.target.elements[1].value.value
    return None
