"""lm-head-bias: a bias on the LM head (Phi, GPT-J)."""

from __future__ import annotations

import libcst as cst

from autoport_cst.spec.pitfalls import Pitfall
from autoport_cst.transform import Codemod, Example, FileContext, NoParams, PortContext
from autoport_cst.transform.anatomy.classes import class_here, require_method
from autoport_cst.transform.anatomy.mappings import entry_statement, mapping_entries
from autoport_cst.transform.cst.snippets import parse_statement
from autoport_cst.transform.cst.vocabulary import (
    code_of,
    deep_statements,
    dotted,
    keyword_arg,
    self_assignment,
    walk,
)
from autoport_cst.transform.edit.layer_guards import other_model_file
from autoport_cst.transform.edit.loaders import LoaderEdits, attach_statement, render_base
from autoport_cst.transform.edit.tree import add_edit, rewrite
from autoport_cst.transform.realizes import Realizes, to


class LmHeadBias(Codemod):
    """Give the LM head a bias, loaded from ``lm_head.bias``.

    The LM head is a ``ColumnParallelLinear`` whose output (the vocabulary) is
    sharded over ranks; its own bias is sharded the same way and added before
    the optional gather, so it is the right place for a vocabulary bias with or
    without on-device sampling. In the causal LM class
    (``<Prefix>ForCausalLM``): every ``ColumnParallelLinear(...)`` assigned to
    ``self.lm_head`` (one per branch when tied and untied heads are built
    apart) gets ``bias=True``; ``self.lm_head.bias`` gets the same
    vocabulary-sharding loader as ``self.lm_head.weight`` without the
    storage transpose (``sharding_weight_loader(shard_dim=0,
    shard_size=self.lm_head.out_features_per_rank,
    num_shards=self.lm_head.tp_size)``), wherever the weight's is built (a
    local variable included) and inside the same rank wrappers
    (``with_rank_override(..., rank=<LM-head TP rank>)`` under LM-head data
    parallelism, so that bias and weight rows match); ``load_weights`` maps
    ``lm_head.bias`` to ``lm_head.bias`` (a bias is never tied to the
    embedding), after the statement holding the ``lm_head.weight`` entries.

    Preconditions: one ``<Prefix>ForCausalLM`` class assigning
    ``self.lm_head = <...>ColumnParallelLinear(...)``, with a
    ``sharding_weight_loader(...)`` attached to ``self.lm_head.weight``
    (wrapped in nothing but rank overrides) and a
    ``mappings["lm_head.weight"]`` entry.
    """

    ID = "lm-head-bias"
    REALIZES = Realizes({"lm_head.bias": to(True)})
    Params = NoParams
    PITFALLS = (
        Pitfall(
            250,
            lambda spec, facts: spec.lm_head.bias,
            "LM head bias: a separate parameter added to the logits, mapped to lm_head.bias",
        ),
    )
    FILES = ("model", "module")
    EXAMPLES = (
        Example(
            title="Phi",
            before="""
                class LlamaForCausalLM(nn.Module):
                    def __init__(self, config):
                        self.lm_head = neuron_nn.ColumnParallelLinear(
                            config.hidden_size,
                            config.vocab_size,
                            bias=False,
                            gather_output=True,
                        )
                        set_weight_loader(
                            self.lm_head.weight,
                            sharding_weight_loader(
                                shard_dim=0,
                                shard_size=self.lm_head.out_features_per_rank,
                                num_shards=self.lm_head.tp_size,
                                is_storage_transposed=False,
                            ),
                        )

                    def load_weights(self, path):
                        mappings = {}
                        if self.config.tie_word_embeddings:
                            mappings["lm_head.weight"] = "model.embed_tokens.weight"
                        else:
                            mappings["lm_head.weight"] = "lm_head.weight"
                        return mappings
            """,
            after="""
                class LlamaForCausalLM(nn.Module):
                    def __init__(self, config):
                        self.lm_head = neuron_nn.ColumnParallelLinear(
                            config.hidden_size,
                            config.vocab_size,
                            bias=True,
                            gather_output=True,
                        )
                        set_weight_loader(
                            self.lm_head.weight,
                            sharding_weight_loader(
                                shard_dim=0,
                                shard_size=self.lm_head.out_features_per_rank,
                                num_shards=self.lm_head.tp_size,
                                is_storage_transposed=False,
                            ),
                        )
                        set_weight_loader(
                            self.lm_head.bias,
                            sharding_weight_loader(
                                shard_dim=0,
                                shard_size=self.lm_head.out_features_per_rank,
                                num_shards=self.lm_head.tp_size,
                            ),
                        )

                    def load_weights(self, path):
                        mappings = {}
                        if self.config.tie_word_embeddings:
                            mappings["lm_head.weight"] = "model.embed_tokens.weight"
                        else:
                            mappings["lm_head.weight"] = "lm_head.weight"
                        mappings["lm_head.bias"] = "lm_head.bias"
                        return mappings
            """,
        ),
        Example(
            title="no ColumnParallelLinear LM head",
            before="""
                class LlamaForCausalLM(nn.Module):
                    def __init__(self, config):
                        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size)
            """,
            raises="self.lm_head = <...>ColumnParallelLinear(...)",
        ),
        Example(
            title="the weight's loader built in a local and wrapped for LM-head data parallelism",
            before="""
                class LlamaForCausalLM(nn.Module):
                    def __init__(self, config):
                        lm_head_tp_group = get_neuron_lm_head_tp_group()
                        self.lm_head = neuron_nn.ColumnParallelLinear(
                            config.hidden_size,
                            config.vocab_size,
                            bias=False,
                            tp_group=lm_head_tp_group.device_group,
                        )
                        lm_head_loader = sharding_weight_loader(
                            shard_dim=0,
                            shard_size=self.lm_head.out_features_per_rank,
                            num_shards=self.lm_head.tp_size,
                            is_storage_transposed=False,
                        )
                        lm_head_loader = with_rank_override(lm_head_loader, rank=lm_head_tp_group.rank_in_group)
                        set_weight_loader(self.lm_head.weight, lm_head_loader)

                    def load_weights(self, checkpoint_path, device, cache_dir):
                        mappings = {}
                        if self.config.tie_word_embeddings:
                            mappings["lm_head.weight"] = "model.embed_tokens.weight"
                        return mappings
            """,
            after="""
                class LlamaForCausalLM(nn.Module):
                    def __init__(self, config):
                        lm_head_tp_group = get_neuron_lm_head_tp_group()
                        self.lm_head = neuron_nn.ColumnParallelLinear(
                            config.hidden_size,
                            config.vocab_size,
                            bias=True,
                            tp_group=lm_head_tp_group.device_group,
                        )
                        lm_head_loader = sharding_weight_loader(
                            shard_dim=0,
                            shard_size=self.lm_head.out_features_per_rank,
                            num_shards=self.lm_head.tp_size,
                            is_storage_transposed=False,
                        )
                        lm_head_loader = with_rank_override(lm_head_loader, rank=lm_head_tp_group.rank_in_group)
                        set_weight_loader(self.lm_head.weight, lm_head_loader)
                        set_weight_loader(
                            self.lm_head.bias,
                            with_rank_override(
                                sharding_weight_loader(
                                    shard_dim=0,
                                    shard_size=self.lm_head.out_features_per_rank,
                                    num_shards=self.lm_head.tp_size,
                                ),
                                rank=lm_head_tp_group.rank_in_group,
                            ),
                        )

                    def load_weights(self, checkpoint_path, device, cache_dir):
                        mappings = {}
                        if self.config.tie_word_embeddings:
                            mappings["lm_head.weight"] = "model.embed_tokens.weight"
                        mappings["lm_head.bias"] = "lm_head.bias"
                        return mappings
            """,
        ),
    )

    @classmethod
    def params_for(cls, diffs, target, port: PortContext) -> NoParams:
        return NoParams()

    def transform_module(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        if ctx.role == "module":
            return other_model_file(module, ctx, self.touches(), "the LM-head bias")
        lm = class_here(module, ctx, "causal_lm", "<Prefix>ForCausalLM")
        if lm is None:
            return module
        name = lm.name.value
        init = require_method(module, ctx, lm, "__init__")
        heads = _heads(init)
        if not heads:
            raise ctx.precondition(
                f"{self.ID}: {name}.__init__ has no self.lm_head = <...>ColumnParallelLinear(...)",
                init,
                module,
            )
        edits: dict = {}
        for ctor in heads:  # one per branch (tied or not)
            bias_arg = keyword_arg(ctor, "bias")
            if bias_arg is None:
                raise ctx.precondition(
                    f"{self.ID}: the LM head's ColumnParallelLinear(...) has no bias= argument "
                    "(its default differs between versions: pass it explicitly)",
                    ctor,
                    module,
                )
            if dotted(bias_arg.value) != "True":
                edits[id(bias_arg)] = lambda updated: updated.with_changes(value=cst.Name("True"))
        loaders = LoaderEdits(module, ctx, lm)
        if not loaders.of("lm_head.bias"):
            for loader in loaders.require("lm_head.weight"):
                loaders.add_after(loader, [self._bias_loader(loaders, loader, module, ctx)])
            for key, edit in loaders.edits().items():
                add_edit(edits, key, edit)
        edits.update(self._mapping_edit(module, ctx))
        return rewrite(module, edits)

    def _bias_loader(
        self, loaders: LoaderEdits, loader, module: cst.Module, ctx: FileContext
    ) -> cst.BaseStatement:
        """``set_weight_loader(self.lm_head.bias, ...)``: the weight's
        vocabulary sharding without the storage transpose, inside the same
        rank wrappers (``with_rank_override``: LM-head data parallelism)."""
        base = loader.base
        if dotted(base.func) != "sharding_weight_loader":
            raise ctx.precondition(
                f"{self.ID}: the loader of self.lm_head.weight is built by {dotted(base.func) or 'a call'}(...), "
                f"not sharding_weight_loader(...) ({loader.describe()})",
                base,
                module,
            )
        args = [
            a for a in base.args if not (a.keyword is not None and a.keyword.value == "is_storage_transposed")
        ]
        if args and len(args) < len(base.args) and base.args[-1] not in args:
            args[-1] = args[-1].with_changes(comma=base.args[-1].comma)
        bias_base = base.with_changes(args=args)
        if not loader.direct:
            code = loaders.sibling_loader(loader, render_base(bias_base, 1 + len(loader.wrappers)))
            return attach_statement("lm_head.bias", code, module)
        code = code_of(bias_base)
        if "\n" not in code:
            return parse_statement(f"set_weight_loader(self.lm_head.bias, {code})", module)
        return parse_statement(f"set_weight_loader(\n    self.lm_head.bias,\n    {code},\n)", module)

    def _mapping_edit(self, module: cst.Module, ctx: FileContext) -> dict:
        entries = mapping_entries(module)
        if any(e.key == "lm_head.bias" for e in entries):
            return {}
        weights = [e for e in entries if e.key == "lm_head.weight"]
        if not weights:
            raise ctx.precondition(f'{self.ID}: load_weights has no mappings["lm_head.weight"] entry')
        entry = weights[-1]
        # the top-level statement of load_weights that holds the entry (an if/else when tied)
        holder = entry.statement
        for node in walk(module):
            if isinstance(node, cst.FunctionDef) and node.name.value == "load_weights":
                body = node.body.body
                for stmt in body:
                    if any(n is entry.statement for n in walk(stmt)):
                        holder = stmt
                        break
        new = entry_statement(entry, cst.SimpleString('"lm_head.bias"'), cst.SimpleString('"lm_head.bias"'))
        return {id(holder): lambda updated: cst.FlattenSentinel([updated, new])}


def _heads(init: cst.FunctionDef) -> list[cst.Call]:
    """The ``ColumnParallelLinear(...)`` calls assigned to ``self.lm_head``
    (anywhere in ``__init__``: one per branch when tied and untied heads are
    built apart)."""
    found = []
    for stmt in deep_statements(init):
        pair = self_assignment(stmt) if isinstance(stmt, cst.SimpleStatementLine) else None
        if (
            pair is not None
            and pair[0] == "lm_head"
            and isinstance(pair[1], cst.Call)
            and (dotted(pair[1].func) or "").endswith("ColumnParallelLinear")
        ):
            found.append(pair[1])
    return found
