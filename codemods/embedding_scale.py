"""embedding-scale: token embeddings multiplied by sqrt(hidden_size) (Gemma)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import libcst as cst

from autoport_cst.spec.pitfalls import Pitfall
from autoport_cst.transform import Codemod, Example, FileContext, PortContext
from autoport_cst.transform.edit.layer_guards import other_model_file
from autoport_cst.transform.edit.scaled_embedding import scaled_embedding
from autoport_cst.transform.realizes import Realizes, to


@dataclass(frozen=True)
class EmbeddingScaleParams:
    scale: Literal["sqrt_hidden"] = field(
        default="sqrt_hidden", metadata={"doc": "sqrt_hidden: multiply by hidden_size ** 0.5."}
    )
    dtype: Literal["model", "float"] = field(
        default="model",
        metadata={
            "doc": "model: the factor rounded to the output's dtype first (Gemma); "
            "float: a Python float multiplied in, unrounded (XGLM, BioGPT)."
        },
    )


class EmbeddingScale(Codemod):
    """Multiply the token embeddings by ``sqrt(hidden_size)``, rounded to the
    model dtype (Gemma) or not (XGLM, BioGPT): the spec's ``embedding.scale_dtype``.

    Gemma's embedding module multiplies its output by ``hidden_size ** 0.5``,
    held in a float32 tensor and cast to the weights' dtype before the
    multiply (in bfloat16, ``sqrt(3072) = 55.43`` becomes ``55.5``). The port
    does the same inside the embedding module, so that the module's output is
    the scaled embedding as in transformers: a ``ScaledVocabEmbedding``
    subclass of ``VocabDimShardedEmbedding`` is added to the model file (its
    forward multiplies the looked-up, reduced output by
    ``output.new_tensor(embed_scale)``: a tensor of the output's dtype and
    device), and the backbone builds its embedding with it, passing
    ``embed_scale=config.hidden_size**0.5`` (a Python float: allowed on the meta
    device). The weight keeps its name and loader. Every lookup path goes
    through the module (embedding data parallelism: gathered token ids, rank
    offsets), so every one is scaled.

    XGLM and BioGPT multiply by a Python float (``math.sqrt(d_model)``), which
    a bfloat16 tensor takes unrounded (in bfloat16, ``sqrt(2048) = 45.25`` is
    ``45.25``, the float 45.2548); with ``dtype="float"`` the module's forward
    multiplies by ``self.embed_scale`` itself.

    Prompt embeddings merged after the lookup (``NF.merge_prompt_embeds``) are
    not scaled: that is Gemma 3, whose transformers embedding module scales
    (embeddings handed in are taken as scaled). Gemma and Gemma 2 scale the
    ``inputs_embeds`` they are handed in the model's forward instead; the
    spec does not tell the two apart, so their ports differ from transformers
    on prompt embeddings (token ids are scaled alike).

    Precondition: one ``<Prefix>Model`` class whose ``__init__`` builds one
    ``VocabDimShardedEmbedding(...)``.
    """

    ID = "embedding-scale"
    REALIZES = Realizes({"embedding.scale": to("sqrt_hidden"), "embedding.scale_dtype": to("float")})
    Params = EmbeddingScaleParams
    PITFALLS = (
        Pitfall(
            260,
            lambda spec, facts: spec.embedding.scale == "sqrt_hidden",
            "embeddings scaled by sqrt(hidden_size): transformers multiplies by the factor rounded to the "
            "model dtype (Gemma) or by the unrounded Python float (XGLM, BioGPT; embedding.scale_dtype): "
            "match it, the two differ in bf16 where the square root is not exact",
        ),
    )
    FILES = ("model", "module")
    EXAMPLES = (
        Example(
            title="Gemma",
            before="""
                class LlamaModel(nn.Module):
                    def __init__(self, config):
                        super().__init__()
                        self.embed_tokens = VocabDimShardedEmbedding(
                            vocab_size=config.vocab_size,
                            embed_dim=config.hidden_size,
                        )
                        self.rotary_emb = LlamaRotaryEmbedding(config)
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
                        super().__init__()
                        self.embed_tokens = ScaledVocabEmbedding(
                            vocab_size=config.vocab_size,
                            embed_dim=config.hidden_size,
                            embed_scale=config.hidden_size**0.5,
                        )
                        self.rotary_emb = LlamaRotaryEmbedding(config)
            ''',
        ),
        Example(
            title="XGLM: a Python float",
            params={"dtype": "float"},
            before="""
                class LlamaModel(nn.Module):
                    def __init__(self, config):
                        super().__init__()
                        self.embed_tokens = VocabDimShardedEmbedding(
                            vocab_size=config.vocab_size,
                            embed_dim=config.hidden_size,
                        )
            """,
            after='''
                class ScaledVocabEmbedding(VocabDimShardedEmbedding):
                    """The vocabulary-sharded token embedding with its output multiplied by a
                    constant factor, a Python float (not rounded to the output's dtype: a
                    bfloat16 model multiplies by the exact factor, as transformers does)."""

                    def __init__(self, *args, embed_scale: float = 1.0, **kwargs):
                        super().__init__(*args, **kwargs)
                        self.embed_scale = embed_scale

                    def forward(self, *args, **kwargs):
                        output = super().forward(*args, **kwargs)
                        return output * self.embed_scale


                class LlamaModel(nn.Module):
                    def __init__(self, config):
                        super().__init__()
                        self.embed_tokens = ScaledVocabEmbedding(
                            vocab_size=config.vocab_size,
                            embed_dim=config.hidden_size,
                            embed_scale=config.hidden_size**0.5,
                        )
            ''',
        ),
        Example(
            title="no embedding in the backbone",
            before="""
                class LlamaModel(nn.Module):
                    def __init__(self, config):
                        self.layers = nn.ModuleList([])
            """,
            raises="builds no VocabDimShardedEmbedding",
        ),
    )

    @classmethod
    def params_for(cls, diffs, target, port: PortContext) -> EmbeddingScaleParams:
        return EmbeddingScaleParams(dtype=target.embedding.scale_dtype)

    def transform_module(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        if ctx.role == "module":
            return other_model_file(module, ctx, self.touches(), "the embedding scale")
        rounded = self.params.dtype == "model"
        return scaled_embedding(module, ctx, "config.hidden_size**0.5", rounded=rounded)
