"""embedding-norm: a norm of the layers' kind on the token embeddings before the first layer (BLOOM)."""

from __future__ import annotations

import libcst as cst

from autoport_cst.spec.pitfalls import Pitfall
from autoport_cst.transform import Codemod, Example, FileContext, NoParams, PortContext
from autoport_cst.transform.anatomy.classes import one_class, require_method
from autoport_cst.transform.anatomy.mappings import entry_statement, mapping_entries
from autoport_cst.transform.cst.snippets import parse_statement
from autoport_cst.transform.cst.vocabulary import classes_with_role, dotted, simple_assign, statements
from autoport_cst.transform.edit.layer_guards import other_model_file
from autoport_cst.transform.edit.tree import followed_by, rewrite, with_comment
from autoport_cst.transform.realizes import Realizes, to

ID = "embedding-norm"
ATTR = "embed_norm"
FINAL = "norm"
MARK = "<-- MODEL-SPECIFIC: a norm on the token embeddings"


class EmbeddingNorm(Codemod):
    """Norm the token embeddings before the first layer with a norm like the final one (BLOOM).

    BLOOM's backbone applies ``word_embeddings_layernorm`` (a LayerNorm with
    bias, like its layer norms) to the token embeddings before the first
    layer; NanoChat applies its (weightless) RMSNorm there. Research sets
    ``embedding.norm`` only when that norm computes what the decoder layers'
    norms compute (kind, bias, weight form, affinity, epsilon), so the port
    builds it exactly as it builds its final norm: in the backbone's
    ``__init__``, ``self.embed_norm = <the expression of self.norm = ...>``
    after the token embedding's statements (the norm codemods that change the
    final norm run first). Its parameters are replicated on every rank, like
    the final norm's: the norm works on whole hidden rows, which every layout
    of the token rows keeps (the SP slice in prefill, the MLP-DP state in
    decode).

    ``forward`` applies it to ``hidden_states`` right after the prompt
    embeddings are merged (``NF.merge_prompt_embeds``; after the token lookup
    when there is no merge): transformers norms ``inputs_embeds`` handed in
    as well. ``load_weights`` maps ``model.embed_norm.<tensor>`` for every
    ``model.norm.<tensor>`` entry (none for a weightless norm);
    ``checkpoint-keys`` then renames ``model.embed_norm`` to the checkpoint's
    module (``transformer.word_embeddings_layernorm``).

    Preconditions: one ``<Prefix>Model`` backbone whose ``__init__`` builds
    ``self.embed_tokens`` and ``self.norm = <call>`` and whose ``forward``
    assigns the token lookup (``hidden_states = self.embed_tokens(...)``).
    """

    ID = ID
    REALIZES = Realizes({"embedding.norm": to(True)})
    Params = NoParams
    # no site family changes: every lookup path (embedding DP, SP scatter) is left as it is, and the
    # norm applies once to the rows they join into
    TOUCHES = ()
    # the final norm as the other norm codemods leave it; the prompt embeddings merged and scaled first
    AFTER = (
        "swap-norm",
        "norm-affine",
        "norm-offset",
        "norm-placement",
        "parallel-residual",
        "embedding-scale",
        "embedding-multiplier",
    )
    PITFALLS = (
        Pitfall(
            268,
            lambda spec, facts: spec.embedding.norm,
            "a norm on the token embeddings before the first layer (like the layers' norms): apply it after "
            "the prompt embeddings are merged, its weights replicated",
        ),
    )
    FILES = ("model", "module")
    EXAMPLES = (
        Example(
            title="BLOOM's word_embeddings_layernorm",
            before="""
                class BloomModel(nn.Module):
                    def __init__(self, config):
                        self.embed_tokens = VocabDimShardedEmbedding(vocab_size=config.vocab_size)
                        set_weight_loader(self.embed_tokens.weight, embedding_loader)
                        self.layers = nn.ModuleList([])
                        self.norm = BloomLayerNorm(config.hidden_size, config.layer_norm_epsilon, config.torch_dtype)

                    def forward(self, input_ids, positions, inputs_embeds=None, is_token_ids=None):
                        hidden_states = self.embed_tokens(input_ids)
                        hidden_states = NF.merge_prompt_embeds(hidden_states, inputs_embeds, is_token_ids)
                        return self.norm(self.layers(hidden_states))


                class BloomForCausalLM(nn.Module):
                    def load_weights(self, checkpoint_path, device, cache_dir):
                        mappings = {}
                        mappings["model.embed_tokens.weight"] = "model.embed_tokens.weight"
                        mappings["model.norm.weight"] = "model.norm.weight"
                        mappings["model.norm.bias"] = "model.norm.bias"
                        return mappings
            """,
            after="""
                class BloomModel(nn.Module):
                    def __init__(self, config):
                        self.embed_tokens = VocabDimShardedEmbedding(vocab_size=config.vocab_size)
                        set_weight_loader(self.embed_tokens.weight, embedding_loader)
                        # <-- MODEL-SPECIFIC: a norm on the token embeddings, built as the final norm (replicated)
                        self.embed_norm = BloomLayerNorm(config.hidden_size, config.layer_norm_epsilon, config.torch_dtype)
                        self.layers = nn.ModuleList([])
                        self.norm = BloomLayerNorm(config.hidden_size, config.layer_norm_epsilon, config.torch_dtype)

                    def forward(self, input_ids, positions, inputs_embeds=None, is_token_ids=None):
                        hidden_states = self.embed_tokens(input_ids)
                        hidden_states = NF.merge_prompt_embeds(hidden_states, inputs_embeds, is_token_ids)
                        # <-- MODEL-SPECIFIC: a norm on the token embeddings before the first layer
                        hidden_states = self.embed_norm(hidden_states)
                        return self.norm(self.layers(hidden_states))


                class BloomForCausalLM(nn.Module):
                    def load_weights(self, checkpoint_path, device, cache_dir):
                        mappings = {}
                        mappings["model.embed_tokens.weight"] = "model.embed_tokens.weight"
                        mappings["model.norm.weight"] = "model.norm.weight"
                        mappings["model.embed_norm.weight"] = "model.embed_norm.weight"
                        mappings["model.norm.bias"] = "model.norm.bias"
                        mappings["model.embed_norm.bias"] = "model.embed_norm.bias"
                        return mappings
            """,
        ),
        Example(
            title="a weightless norm (NanoChat): nothing to load",
            before="""
                class NanochatModel(nn.Module):
                    def __init__(self, config):
                        self.embed_tokens = VocabDimShardedEmbedding(vocab_size=config.vocab_size)
                        self.norm = NanochatRMSNorm(config.hidden_size, config.rms_norm_eps)

                    def forward(self, input_ids, positions):
                        hidden_states = self.embed_tokens(input_ids)
                        return self.norm(hidden_states)
            """,
            after="""
                class NanochatModel(nn.Module):
                    def __init__(self, config):
                        self.embed_tokens = VocabDimShardedEmbedding(vocab_size=config.vocab_size)
                        # <-- MODEL-SPECIFIC: a norm on the token embeddings, built as the final norm (replicated)
                        self.embed_norm = NanochatRMSNorm(config.hidden_size, config.rms_norm_eps)
                        self.norm = NanochatRMSNorm(config.hidden_size, config.rms_norm_eps)

                    def forward(self, input_ids, positions):
                        hidden_states = self.embed_tokens(input_ids)
                        # <-- MODEL-SPECIFIC: a norm on the token embeddings before the first layer
                        hidden_states = self.embed_norm(hidden_states)
                        return self.norm(hidden_states)
            """,
        ),
        Example(
            title="no final norm to build it as",
            before="""
                class BloomModel(nn.Module):
                    def __init__(self, config):
                        self.embed_tokens = VocabDimShardedEmbedding(vocab_size=config.vocab_size)

                    def forward(self, input_ids, positions):
                        hidden_states = self.embed_tokens(input_ids)
                        return hidden_states
            """,
            raises="builds no `self.norm = <norm>(...)`",
        ),
    )

    @classmethod
    def params_for(cls, diffs, target, port: PortContext) -> NoParams:
        return NoParams()

    def transform_module(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        if ctx.role == "module":
            return other_model_file(module, ctx, self.touches(), "the embedding norm")
        if not classes_with_role(module, "backbone"):
            return module
        backbone = one_class(module, ctx, "backbone", "<Prefix>Model backbone")
        init = require_method(module, ctx, backbone, "__init__")
        forward = require_method(module, ctx, backbone, "forward")
        if any(_assigns(s, f"self.{ATTR}") for s in statements(init)):
            return module  # applied already
        edits: dict = {}
        _init_edit(backbone.name.value, init, module, ctx, edits)
        _forward_edit(backbone.name.value, forward, module, ctx, edits)
        _mapping_edits(module, edits)
        return rewrite(module, edits)


def _assigns(stmt: cst.BaseStatement, target: str) -> bool:
    pair = simple_assign(stmt)
    return pair is not None and dotted(pair[0]) == target


def _init_edit(name: str, init: cst.FunctionDef, module: cst.Module, ctx: FileContext, edits: dict) -> None:
    """``self.embed_norm`` built as ``self.norm`` is, after the token embedding's statements."""
    body = list(statements(init))
    finals = [pair[1] for s in body if (pair := simple_assign(s)) and dotted(pair[0]) == f"self.{FINAL}"]
    if len(finals) != 1 or not isinstance(finals[0], cst.Call):
        raise ctx.refuse(
            f"{name}.__init__ builds no `self.{FINAL} = <norm>(...)` to build the embedding norm as"
        )
    tokens = [s for s in body if "self.embed_tokens" in module.code_for_node(s)]
    if not tokens:
        raise ctx.refuse(f"{name}.__init__ builds no self.embed_tokens", init, module)
    built = parse_statement(f"self.{ATTR} = {module.code_for_node(finals[0])}", module)
    edits[id(tokens[-1])] = followed_by(with_comment(built, f"{MARK}, built as the final norm (replicated)"))


def _forward_edit(
    name: str, forward: cst.FunctionDef, module: cst.Module, ctx: FileContext, edits: dict
) -> None:
    """``hidden_states = self.embed_norm(hidden_states)`` after the merged prompt embeddings (or the lookup)."""
    body = list(statements(forward))
    anchors = [s for s in body if _assigns_call(s, "NF.merge_prompt_embeds")] or [
        s for s in body if _assigns_call(s, "self.embed_tokens")
    ]
    if not anchors:
        raise ctx.refuse(f"{name}.forward assigns no token lookup (self.embed_tokens(...))", forward, module)
    target = simple_assign(anchors[-1])
    assert target is not None  # as _assigns_call found it
    var = module.code_for_node(target[0])
    normed = parse_statement(f"{var} = self.{ATTR}({var})", module)
    edits[id(anchors[-1])] = followed_by(with_comment(normed, f"{MARK} before the first layer"))


def _assigns_call(stmt: cst.BaseStatement, callee: str) -> bool:
    pair = simple_assign(stmt)
    return pair is not None and isinstance(pair[1], cst.Call) and dotted(pair[1].func) == callee


def _mapping_edits(module: cst.Module, edits: dict) -> None:
    """``mappings["model.embed_norm.<t>"] = "model.embed_norm.<t>"`` after each ``model.norm.<t>`` entry."""
    prefix = f"model.{FINAL}."
    entries = mapping_entries(module)
    if any(e.key.startswith(f"model.{ATTR}.") for e in entries):
        return
    for entry in entries:
        if entry.key.startswith(prefix):
            text = f'"model.{ATTR}.{entry.key[len(prefix) :]}"'
            # two nodes: checkpoint-keys renames the value's (the checkpoint key), never the parameter's
            added = entry_statement(entry, cst.SimpleString(text), cst.SimpleString(text))
            edits[id(entry.statement)] = followed_by(added)
