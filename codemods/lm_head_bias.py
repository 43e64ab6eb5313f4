"""lm-head-bias: a bias on the LM head (Phi, GPT-J)."""

from __future__ import annotations

import libcst as cst

from autoport_cst.transform import Codemod, Example, FileContext, NoParams, PortContext
from autoport_cst.transform.cst_helpers import (
    code_of,
    deep_statements,
    dotted,
    keyword_arg,
    parse_statement,
    rewrite,
    walk,
)
from autoport_cst.transform.layers import one_class, require_method, self_assignments
from autoport_cst.transform.mappings import entry_statement, mapping_entries


class LmHeadBias(Codemod):
    """Give the LM head a bias, loaded from ``lm_head.bias``.

    The LM head is a ``ColumnParallelLinear`` whose output (the vocabulary) is
    sharded over ranks; its own bias is sharded the same way and added before
    the optional gather, so it is the right place for a vocabulary bias with or
    without on-device sampling. In the causal LM class
    (``<Prefix>ForCausalLM``): the ``ColumnParallelLinear(...)`` assigned to
    ``self.lm_head`` gets ``bias=True``; ``self.lm_head.bias`` gets the same
    vocabulary-sharding loader as ``self.lm_head.weight`` without the
    storage transpose (``sharding_weight_loader(shard_dim=0,
    shard_size=self.lm_head.out_features_per_rank,
    num_shards=self.lm_head.tp_size)``); ``load_weights`` maps
    ``lm_head.bias`` to ``lm_head.bias`` (a bias is never tied to the
    embedding), after the statement holding the ``lm_head.weight`` entries.

    Preconditions: one ``<Prefix>ForCausalLM`` class assigning
    ``self.lm_head = <...>ColumnParallelLinear(...)``, with a loader attached to
    ``self.lm_head.weight`` and a ``mappings["lm_head.weight"]`` entry.
    """

    ID = "lm-head-bias"
    REALIZES = ("lm_head.bias",)
    Params = NoParams
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
    )

    @classmethod
    def realizes(cls, diff) -> bool:
        return diff.path in cls.REALIZES and diff.target is True

    @classmethod
    def params_for(cls, diffs, target, port: PortContext) -> NoParams:
        return NoParams()

    def transform_module(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        lm = one_class(module, "causal_lm", ctx, self.ID, "<Prefix>ForCausalLM")
        name = lm.name.value
        init = require_method(lm, "__init__", ctx, module, self.ID)
        head = self_assignments(init).get("lm_head")
        ctor = head[1] if head is not None else None
        if not (isinstance(ctor, cst.Call) and (dotted(ctor.func) or "").endswith("ColumnParallelLinear")):
            raise ctx.precondition(
                f"{self.ID}: {name}.__init__ has no self.lm_head = <...>ColumnParallelLinear(...)", init, module
            )
        edits: dict = {}
        bias_arg = keyword_arg(ctor, "bias")
        if bias_arg is None or dotted(bias_arg.value) != "True":
            if bias_arg is None:
                raise ctx.precondition(
                    f"{self.ID}: the LM head's ColumnParallelLinear(...) has no bias= argument "
                    "(its default differs between versions: pass it explicitly)",
                    ctor,
                    module,
                )
            edits[id(bias_arg)] = lambda updated: updated.with_changes(value=cst.Name("True"))
        loaders = {}
        for stmt in deep_statements(init):
            if isinstance(stmt, cst.SimpleStatementLine) and isinstance(stmt.body[0], cst.Expr):
                call = stmt.body[0].value
                if isinstance(call, cst.Call) and dotted(call.func) == "set_weight_loader" and len(call.args) >= 2:
                    loaders[dotted(call.args[0].value)] = (stmt, call.args[1].value)
        if "self.lm_head.weight" not in loaders:
            raise ctx.precondition(
                f"{self.ID}: {name} attaches no loader to self.lm_head.weight", init, module
            )
        if "self.lm_head.bias" not in loaders:
            stmt, loader = loaders["self.lm_head.weight"]
            if not isinstance(loader, cst.Call) or dotted(loader.func) != "sharding_weight_loader":
                raise ctx.precondition(
                    f"{self.ID}: the loader of self.lm_head.weight is not a sharding_weight_loader(...)", stmt, module
                )
            args = [a for a in loader.args if not (a.keyword is not None and a.keyword.value == "is_storage_transposed")]
            if args and len(args) < len(loader.args) and loader.args[-1] not in args:
                args[-1] = args[-1].with_changes(comma=loader.args[-1].comma)
            code = code_of(loader.with_changes(args=args))
            new = parse_statement(f"set_weight_loader(\n    self.lm_head.bias,\n    {code},\n)", module)
            if "\n" not in code:
                new = parse_statement(f"set_weight_loader(self.lm_head.bias, {code})", module)
            edits[id(stmt)] = lambda updated: cst.FlattenSentinel([updated, new])
        edits.update(self._mapping_edit(module, ctx))
        return rewrite(module, edits)

    def _mapping_edit(self, module: cst.Module, ctx: FileContext) -> dict:
        entries = mapping_entries(module)
        if any(e.key == "lm_head.bias" for e in entries):
            return {}
        weights = [e for e in entries if e.key == "lm_head.weight"]
        if not weights:
            raise ctx.precondition(f"{self.ID}: load_weights has no mappings[\"lm_head.weight\"] entry")
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
