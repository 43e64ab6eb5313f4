"""tie-embeddings: the LM head loaded from the token embedding (GPT-2, MPT, BLOOM)."""

from __future__ import annotations

import libcst as cst

from autoport_cst.transform import Codemod, Example, FileContext, NoParams, PortContext
from autoport_cst.transform.anatomy.mappings import mapping_entries, parameter_names
from autoport_cst.transform.anatomy.qkv import assigned_attrs
from autoport_cst.transform.cst.vocabulary import classes_with_role, string_text
from autoport_cst.transform.edit.tree import rewrite
from autoport_cst.transform.realizes import Realizes, to

EMBEDDING_KEY = "model.embed_tokens.weight"
HEAD_KEY = "lm_head.weight"


class TieEmbeddings(Codemod):
    """Load the LM head's weight from the token embedding's checkpoint key.

    A tied checkpoint stores no ``lm_head.weight``: the head is the embedding
    matrix. In ``load_weights``, every ``mappings["lm_head.weight"] = ...``
    (each branch of a tied/untied ``if`` included) takes the value of
    ``mappings["model.embed_tokens.weight"]``, the embedding's checkpoint
    key, when ``self.config.tie_word_embeddings`` is true and keeps its own
    value otherwise (a port is for the architecture: an untied checkpoint of
    it still loads its own head), whatever names the key (so it composes with ``checkpoint-keys`` in either
    order; that codemod runs after this one and renames the copied key with
    the embedding's). The head keeps its own parameter and loader: the
    embedding's rows are loaded into it sharded over the vocabulary as the
    head's weight would be.

    An embedding that ``load_weights`` does not map loads under its own
    name (the real llama3): the head then takes ``"model.embed_tokens.weight"``
    when a causal LM class of the file has that parameter.

    Preconditions: a ``mappings["lm_head.weight"]`` entry; a causal LM class
    that keeps ``self.config``; exactly one
    checkpoint key mapped to ``model.embed_tokens.weight`` in the file, or
    none and that parameter in the causal LM class.
    """

    ID = "tie-embeddings"
    REALIZES = Realizes({"embedding.tied": to(True)})
    Params = NoParams
    FILES = ("model",)
    # the checkpoint key of the head's weight only: no lookup or logits site changes
    TOUCHES = ()
    EXAMPLES = (
        Example(
            title="GPT-2 from the real qwen3 (untied head)",
            before="""
                class Qwen3ForCausalLM(nn.Module):
                    def __init__(self, config):
                        self.config = config

                    def load_weights(self, checkpoint_path, device, cache_dir):
                        mappings = {}
                        mappings["model.embed_tokens.weight"] = "model.embed_tokens.weight"
                        mappings["lm_head.weight"] = "lm_head.weight"
                        mappings["model.norm.weight"] = "model.norm.weight"
                        return mappings
            """,
            after="""
                class Qwen3ForCausalLM(nn.Module):
                    def __init__(self, config):
                        self.config = config

                    def load_weights(self, checkpoint_path, device, cache_dir):
                        mappings = {}
                        mappings["model.embed_tokens.weight"] = "model.embed_tokens.weight"
                        mappings["lm_head.weight"] = "model.embed_tokens.weight" if self.config.tie_word_embeddings else "lm_head.weight"
                        mappings["model.norm.weight"] = "model.norm.weight"
                        return mappings
            """,
        ),
        Example(
            title="tied and untied branches, the embedding's key already renamed",
            before="""
                class LlamaForCausalLM(nn.Module):
                    def __init__(self, config):
                        self.config = config

                    def load_weights(self, path):
                        mappings = {}
                        mappings["model.embed_tokens.weight"] = "transformer.wte.weight"
                        if self.config.tie_word_embeddings:
                            mappings["lm_head.weight"] = "transformer.wte.weight"
                        else:
                            mappings["lm_head.weight"] = "lm_head.weight"
                        return mappings
            """,
            after="""
                class LlamaForCausalLM(nn.Module):
                    def __init__(self, config):
                        self.config = config

                    def load_weights(self, path):
                        mappings = {}
                        mappings["model.embed_tokens.weight"] = "transformer.wte.weight"
                        if self.config.tie_word_embeddings:
                            mappings["lm_head.weight"] = "transformer.wte.weight"
                        else:
                            mappings["lm_head.weight"] = "transformer.wte.weight" if self.config.tie_word_embeddings else "lm_head.weight"
                        return mappings
            """,
        ),
        Example(
            title="the embedding unmapped: it loads under its own name (the real llama3)",
            before="""
                class LlamaModel(nn.Module):
                    def __init__(self, config):
                        self.embed_tokens = neuron_nn.ParallelEmbedding(config.vocab_size, config.hidden_size)
                        set_weight_loader(self.embed_tokens.weight, sharding_weight_loader(shard_dim=0))

                class LlamaForCausalLM(nn.Module):
                    def __init__(self, config):
                        self.config = config
                        self.model = LlamaModel(config)

                    def load_weights(self, path):
                        mappings = {}
                        mappings["lm_head.weight"] = "lm_head.weight"
                        return mappings
            """,
            after="""
                class LlamaModel(nn.Module):
                    def __init__(self, config):
                        self.embed_tokens = neuron_nn.ParallelEmbedding(config.vocab_size, config.hidden_size)
                        set_weight_loader(self.embed_tokens.weight, sharding_weight_loader(shard_dim=0))

                class LlamaForCausalLM(nn.Module):
                    def __init__(self, config):
                        self.config = config
                        self.model = LlamaModel(config)

                    def load_weights(self, path):
                        mappings = {}
                        mappings["lm_head.weight"] = "model.embed_tokens.weight" if self.config.tie_word_embeddings else "lm_head.weight"
                        return mappings
            """,
        ),
        Example(
            title="no self.config: an untied config could not be told apart",
            before="""
                class Qwen3ForCausalLM(nn.Module):
                    def load_weights(self, checkpoint_path, device, cache_dir):
                        mappings = {}
                        mappings["model.embed_tokens.weight"] = "model.embed_tokens.weight"
                        mappings["lm_head.weight"] = "lm_head.weight"
                        return mappings
            """,
            raises="no causal LM class keeps self.config",
        ),
        Example(
            title="no LM-head entry",
            before="""
                class LlamaForCausalLM(nn.Module):
                    def load_weights(self, path):
                        mappings = {}
                        mappings["model.embed_tokens.weight"] = "model.embed_tokens.weight"
                        return mappings
            """,
            raises='no mappings["lm_head.weight"] entry',
        ),
        Example(
            title="no embedding entry",
            before="""
                class LlamaForCausalLM(nn.Module):
                    def load_weights(self, path):
                        mappings = {}
                        mappings["lm_head.weight"] = "lm_head.weight"
                        return mappings
            """,
            raises='no mappings["model.embed_tokens.weight"] entry',
        ),
    )

    @classmethod
    def params_for(cls, diffs, target, port: PortContext) -> NoParams:
        return NoParams()

    def transform_module(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        entries = mapping_entries(module)
        heads = [e for e in entries if e.key == HEAD_KEY]
        if not heads:
            raise ctx.precondition(f'{self.ID}: load_weights has no mappings["{HEAD_KEY}"] entry')
        key = self._embedding_key(module, ctx, entries, heads[0].statement)
        if not any("config" in assigned_attrs(c) for c in classes_with_role(module, "causal_lm")):
            raise ctx.precondition(
                f"{self.ID}: no causal LM class keeps self.config: load_weights cannot read "
                "tie_word_embeddings, and an untied checkpoint's head would load the embedding",
                heads[0].statement,
                module,
            )
        edits = {
            id(head.value): (lambda updated, key=key: _tied_or(key, updated))
            for head in heads
            if not _loads(head.value, key)
        }
        return rewrite(module, edits)

    def _embedding_key(self, module: cst.Module, ctx: FileContext, entries, head) -> cst.BaseExpression:
        """The checkpoint key of ``model.embed_tokens.weight``: its entry's
        value, or its own name when no entry maps it and a causal LM class
        of the file has that parameter (it loads under its own name)."""
        embeddings = [e for e in entries if e.key == EMBEDDING_KEY]
        values = {string_text(e.value) for e in embeddings}
        if len(values) == 1 and None not in values:
            return embeddings[0].value
        if not embeddings and any(
            EMBEDDING_KEY in parameter_names(module, cls) for cls in classes_with_role(module, "causal_lm")
        ):
            return cst.SimpleString(f'"{EMBEDDING_KEY}"')
        found = ", ".join(sorted(str(v) for v in values)) or "none"
        raise ctx.precondition(
            f'{self.ID}: no mappings["{EMBEDDING_KEY}"] entry with one checkpoint key (found: {found}), '
            "nor that parameter unmapped in a causal LM class: the LM head has no embedding key to load from",
            head,
            module,
        )


def _tied_or(key: cst.BaseExpression, value: cst.BaseExpression) -> cst.BaseExpression:
    """``key if self.config.tie_word_embeddings else value``: a tied config
    loads the head from the embedding, an untied one as before."""
    return cst.IfExp(
        test=cst.parse_expression("self.config.tie_word_embeddings"), body=key.deep_clone(), orelse=value
    )


def _loads(value: cst.BaseExpression, key: cst.BaseExpression) -> bool:
    """Whether the head's entry already loads ``key`` (for a tied config)."""
    if isinstance(value, cst.IfExp):
        value = value.body
    return string_text(value) == string_text(key)
