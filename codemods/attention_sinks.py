"""attention-sinks: a learned per-head sink logit in the attention softmax (GPT-OSS)."""

from __future__ import annotations

import libcst as cst

from autoport_cst.spec.pitfalls import Pitfall
from autoport_cst.transform import Codemod, Example, FileContext, NoParams, PortContext
from autoport_cst.transform.anatomy.attention import (
    DECODE,
    FLASH,
    KERNEL_NAMES,
    SEGMENTED_CP,
    attention_classes_in,
    kernel_sites,
    self_parameters,
)
from autoport_cst.transform.anatomy.classes import is_parameter, is_quantized, require_method
from autoport_cst.transform.anatomy.loaders import RANK_WRAPPERS, find_loaders
from autoport_cst.transform.anatomy.mappings import entry_statement, mapping_entries
from autoport_cst.transform.cst.snippets import parse_expr, parse_statements
from autoport_cst.transform.cst.vocabulary import (
    code_of,
    dotted,
    is_none,
    keyword_arg,
    self_assignment,
    self_attr,
    statements,
    walk,
)
from autoport_cst.transform.edit.arguments import set_keyword
from autoport_cst.transform.edit.functions import add_functions
from autoport_cst.transform.edit.guards import guard_edit
from autoport_cst.transform.edit.imports import ensure_import_from
from autoport_cst.transform.edit.kernels import argument, guard
from autoport_cst.transform.edit.loaders import attach_statement, render_call, render_loader
from autoport_cst.transform.edit.tree import (
    add_edit,
    insert_many_after,
    replace_string_suffix,
    rewrite,
    with_comment,
)
from autoport_cst.transform.realizes import Realizes, to

ID = "attention-sinks"
WEIGHT_LOADERS = "vllm_neuron.utils.weight_loader"

SINKS = "self.sinks = nn.Parameter(torch.zeros(self.num_attention_heads_per_rank, dtype=torch.float32))"
PARAMETER_COMMENT = "<-- MODEL-SPECIFIC: a learned sink logit per query head (float32), sharded by head"
LOADER_COMMENT = "<-- MODEL-SPECIFIC: the sinks are sharded by query head, as the output projection's rows"
GUARD_COMMENT = "<-- MODEL-SPECIFIC: attention sinks: a path whose kernel takes none refuses"
CP_MESSAGE = "attention sinks: NF.segmented_attention_cp (context-parallel prefill) takes no sink"
QUANTIZED_MESSAGE = "attention sinks are not ported to the quantized attention class"

DP_SINKS = '''
def _attention_dp_sinks(sinks, attention_dp, group, dcp_size=1):
    """The sink logits [heads, 1] of the query heads the decode kernel attends
    with: under attention data parallelism it gathers the heads of every rank
    of ``group`` (in rank order), so their sinks are gathered alike. Decode
    context parallelism spreads heads over the DCP ranks too: not ported."""
    if dcp_size > 1:
        raise NotImplementedError("attention sinks: decode context parallelism (DCP) is not ported")
    sink = sinks.unsqueeze(1)
    if attention_dp == 1:
        return sink
    return group.all_gather(sink, dim=0)
'''


class AttentionSinks(Codemod):
    """A learned sink logit per query head in the attention softmax (GPT-OSS, GraniteSWA).

    The sink is one more column in each row of the softmax, with no value: it
    only takes probability mass (GraniteSWA's ``sigmoid(logsumexp - sink)``
    output scaling is the same thing).

    Model file, attention class (``<Prefix>Attention``):

    - ``__init__`` creates ``self.sinks``, this rank's query heads' sinks in
      float32 (``num_attention_heads_per_rank`` of them);
    - its loader is attached right after the output projection's and built
      like it: a ``sharding_weight_loader`` over the same ``num_shards`` (TP,
      times attention DP where the layer shards query heads over it), inside
      the same rank wrapper (``with_rank_override(..., rank=<effective
      rank>)``), so each rank reads the sinks of the heads whose rows of
      ``o_proj`` it holds;
    - ``NF.flash_attention`` and ``NF.segmented_attention`` (or their unfused
      forms) get ``sink=self.sinks.unsqueeze(1)`` (``[Nq, 1]``);
    - ``NF.attention_decode`` gets the same, or, when the call runs attention
      data parallelism (``attention_dp=`` not 1), the sinks of the heads of
      every attention-DP rank, which the kernel attends with:
      ``_attention_dp_sinks(self.sinks, <attention_dp>, self.<group>)``
      gathers them over the layer's ``attention_dp_group``;
    - ``NF.segmented_attention_cp`` takes no sink: its path raises
      ``NotImplementedError``.

    ``load_weights`` maps ``...self_attn.sinks`` to the checkpoint key of the
    same name (in the file that maps the keys), its entry after the output
    projection's and after any q/k norm entries there, so that the order of
    the entries does not depend on whether qk-norm ran first.

    Preconditions: an attention class with ``self.num_attention_heads_per_rank``
    set in ``__init__`` before its parameters, a sharding loader (with
    ``num_shards=``) attached to ``self.o_proj_weight``, flash attention and
    decode kernel calls, and a ``...self_attn.o_proj_weight`` mapping entry
    where ``load_weights`` maps keys.
    """

    ID = ID
    REALIZES = Realizes({"attention.sinks": to(True)})
    Params = NoParams
    NEEDS_REAL_MODEL = True
    PITFALLS = (
        Pitfall(
            80,
            lambda spec, facts: spec.attention.sinks,
            "attention sinks: pass sink=self.sinks.unsqueeze(1) ([heads, 1]) to the decode kernel, shard per head",
        ),
    )
    EXAMPLES = (
        Example(
            title="sinks on both paths, sharded like the output projection (TP)",
            before="""
                from vllm_neuron.utils.weight_loader import set_weight_loader


                class GptOssAttention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, self.qkv_size))
                        self.o_proj_weight = nn.Parameter(torch.empty(self.q_size, self.hidden_size))
                        set_weight_loader(
                            self.o_proj_weight,
                            sharding_weight_loader(shard_dim=0, shard_size=self.q_size, num_shards=self.world_size),
                        )

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
                            self.o_proj_weight,
                            sharding_weight_loader(shard_dim=0, shard_size=self.q_size, num_shards=self.world_size),
                        )
                        # <-- MODEL-SPECIFIC: the sinks are sharded by query head, as the output projection's rows
                        set_weight_loader(
                            self.sinks,
                            sharding_weight_loader(
                                shard_dim=0,
                                shard_size=self.num_attention_heads_per_rank,
                                num_shards=self.world_size,
                            ),
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
            title=(
                "every path of a layer that shards query heads over TP x attention DP: flash and segmented "
                "prefill, decode (with the heads of every attention-DP rank), context-parallel prefill guarded"
            ),
            before="""
                from vllm_neuron.utils.weight_loader import set_weight_loader, sharding_weight_loader, with_rank_override


                class LlamaAttention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.num_attention_heads_per_rank = self.num_attention_heads // (self.world_size * self.attention_dp_size)
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, self.qkv_size))
                        self.o_proj_weight = nn.Parameter(torch.empty(self.q_size, self.hidden_size))
                        self._setup_weight_loaders()

                    def _setup_weight_loaders(self):
                        ddp = self.attention_dp_size
                        effective_q_rank = self.attention_dp_rank + self.rank * ddp
                        set_weight_loader(
                            self.o_proj_weight,
                            with_rank_override(
                                sharding_weight_loader(shard_dim=0, shard_size=self.q_size, num_shards=self.world_size * ddp),
                                rank=effective_q_rank,
                            ),
                        )

                    def forward_prefill(self, q, k, v, meta):
                        if self.dcp_size > 1:
                            out = NF.segmented_attention_cp(q=q, k_local=k, v_local=v, scale=self.scaling)
                        elif meta["kv_segment_size"]:
                            out = NF.segmented_attention(q, k_cache=self.k_cache, v_cache=self.v_cache, scale=self.scaling)
                        else:
                            out = NF.flash_attention(q, k, v, scale=self.scaling)
                        return out

                    def forward_decode(self, x, mask, pos_ids):
                        return NF.attention_decode(
                            X=x,
                            attention_mask=mask,
                            pos_ids=pos_ids,
                            softmax_scale=self.scaling,
                            sink=None,
                            attention_dp=self.attention_dp_size,
                            attention_dp_group=self.attention_dp_group.device_group if self.attention_dp_group else None,
                        )
            """,
            after='''
                from vllm_neuron.utils.weight_loader import set_weight_loader, sharding_weight_loader, with_rank_override


                def _attention_dp_sinks(sinks, attention_dp, group, dcp_size=1):
                    """The sink logits [heads, 1] of the query heads the decode kernel attends
                    with: under attention data parallelism it gathers the heads of every rank
                    of ``group`` (in rank order), so their sinks are gathered alike. Decode
                    context parallelism spreads heads over the DCP ranks too: not ported."""
                    if dcp_size > 1:
                        raise NotImplementedError("attention sinks: decode context parallelism (DCP) is not ported")
                    sink = sinks.unsqueeze(1)
                    if attention_dp == 1:
                        return sink
                    return group.all_gather(sink, dim=0)


                class LlamaAttention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.num_attention_heads_per_rank = self.num_attention_heads // (self.world_size * self.attention_dp_size)
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, self.qkv_size))
                        self.o_proj_weight = nn.Parameter(torch.empty(self.q_size, self.hidden_size))
                        # <-- MODEL-SPECIFIC: a learned sink logit per query head (float32), sharded by head
                        self.sinks = nn.Parameter(torch.zeros(self.num_attention_heads_per_rank, dtype=torch.float32))
                        self._setup_weight_loaders()

                    def _setup_weight_loaders(self):
                        ddp = self.attention_dp_size
                        effective_q_rank = self.attention_dp_rank + self.rank * ddp
                        set_weight_loader(
                            self.o_proj_weight,
                            with_rank_override(
                                sharding_weight_loader(shard_dim=0, shard_size=self.q_size, num_shards=self.world_size * ddp),
                                rank=effective_q_rank,
                            ),
                        )
                        # <-- MODEL-SPECIFIC: the sinks are sharded by query head, as the output projection's rows
                        set_weight_loader(
                            self.sinks,
                            with_rank_override(
                                sharding_weight_loader(
                                    shard_dim=0,
                                    shard_size=self.num_attention_heads_per_rank,
                                    num_shards=self.world_size * ddp,
                                ),
                                rank=effective_q_rank,
                            ),
                        )

                    def forward_prefill(self, q, k, v, meta):
                        if self.dcp_size > 1:
                            # <-- MODEL-SPECIFIC: attention sinks: a path whose kernel takes none refuses
                            if self.sinks is not None:
                                raise NotImplementedError(
                                    "attention sinks: NF.segmented_attention_cp (context-parallel prefill) takes no sink"
                                )
                            out = NF.segmented_attention_cp(q=q, k_local=k, v_local=v, scale=self.scaling)
                        elif meta["kv_segment_size"]:
                            out = NF.segmented_attention(q, k_cache=self.k_cache, v_cache=self.v_cache, scale=self.scaling, sink=self.sinks.unsqueeze(1))
                        else:
                            out = NF.flash_attention(q, k, v, scale=self.scaling, sink=self.sinks.unsqueeze(1))
                        return out

                    def forward_decode(self, x, mask, pos_ids):
                        return NF.attention_decode(
                            X=x,
                            attention_mask=mask,
                            pos_ids=pos_ids,
                            softmax_scale=self.scaling,
                            sink=_attention_dp_sinks(self.sinks, self.attention_dp_size, self.attention_dp_group),
                            attention_dp=self.attention_dp_size,
                            attention_dp_group=self.attention_dp_group.device_group if self.attention_dp_group else None,
                        )
            ''',
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
            raises="attention-sinks: no NF.attention_decode(...) call in GptOssAttention",
        ),
    )

    @classmethod
    def params_for(cls, diffs, target, port: PortContext) -> NoParams:
        return NoParams()

    def transform_module(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        edits: dict = {}
        helpers: list[str] = []
        wrapped = False
        for cls in attention_classes_in(module, ctx):
            if is_quantized(cls):
                self._guard_quantized(cls, module, ctx, edits)
                continue
            self._kernel_edits(cls, module, ctx, edits, helpers)
            wrapped |= self._parameter_edits(cls, module, ctx, edits)
        module = rewrite(module, edits)
        if helpers:
            module = add_functions(module, helpers)
        for name in ("sharding_weight_loader", "set_weight_loader") + (
            ("with_rank_override",) if wrapped else ()
        ):
            if edits:
                module = ensure_import_from(module, WEIGHT_LOADERS, name)
        return self._mappings(module, ctx)

    def _guard_quantized(self, cls: cst.ClassDef, module: cst.Module, ctx: FileContext, edits: dict) -> None:
        """A quantized attention class loads its projections its own way:
        it refuses to be built rather than run without sinks."""
        for key, edit in guard_edit(cls, QUANTIZED_MESSAGE, module).items():
            add_edit(edits, key, edit)
        for site in kernel_sites(cls):
            ctx.unaffected(site.call, f"guarded: {QUANTIZED_MESSAGE}")

    def _parameter_edits(self, cls: cst.ClassDef, module: cst.Module, ctx: FileContext, edits: dict) -> bool:
        """``self.sinks`` after the projections, its loader after the output
        projection's, built the same way: this rank's query heads of the same
        shards (TP, times attention DP where the layer shards heads over it),
        read at the same rank. Returns whether the loader is rank-wrapped."""
        name = cls.name.value
        init = require_method(module, ctx, cls, "__init__")
        loaders = find_loaders(cls)
        if "sinks" in loaders:
            return False
        o_proj = next(iter(loaders.get("o_proj_weight", [])), None)
        if o_proj is None or o_proj.base is None or keyword_arg(o_proj.base, "num_shards") is None:
            raise ctx.precondition(
                f"{ID}: {name} attaches no sharding loader with num_shards= to self.o_proj_weight "
                f"({o_proj.problem if o_proj is not None and o_proj.problem else 'the sinks are sharded like it'})",
                o_proj.statement if o_proj is not None else cls,
                module,
            )
        if "sinks" not in self_parameters(cls):
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
            new = parse_statements(SINKS, module)
            new[0] = with_comment(new[0], PARAMETER_COMMENT)
            _after(edits, anchor, new)
        wrappers = tuple(w for w in o_proj.wrappers if dotted(w.func) in RANK_WRAPPERS)
        shards = code_of(keyword_arg(o_proj.base, "num_shards").value)
        arguments = ["shard_dim=0", "shard_size=self.num_attention_heads_per_rank", f"num_shards={shards}"]
        base = render_call("sharding_weight_loader", arguments, 1 + len(wrappers))
        loader = render_loader(base, wrappers)
        _after(
            edits, o_proj.statement, [with_comment(attach_statement("sinks", loader, module), LOADER_COMMENT)]
        )
        return bool(wrappers)

    def _kernel_edits(
        self, cls: cst.ClassDef, module: cst.Module, ctx: FileContext, edits: dict, helpers: list[str]
    ) -> None:
        name = cls.name.value
        sites = kernel_sites(cls)
        for kind in (FLASH, DECODE):
            if not any(site.kind == kind for site in sites):
                raise ctx.precondition(f"{ID}: no {KERNEL_NAMES[kind]}(...) call in {name}", cls, module)
        after = ("sliding_window", "scale", "softmax_scale")
        for site in sites:
            if site.kind == SEGMENTED_CP:
                guard(module, ctx, site, "self.sinks is not None", CP_MESSAGE, edits, GUARD_COMMENT)
                continue
            sink = parse_expr("self.sinks.unsqueeze(1)", module)
            if site.kind == DECODE:
                sink = self._decode_sink(site, cls, module, ctx, helpers) or sink
            edits[id(site.call)] = lambda updated, sink=sink: set_keyword(updated, "sink", sink, after=after)

    def _decode_sink(self, site, cls, module, ctx, helpers: list[str]) -> cst.BaseExpression | None:
        """With attention data parallelism the decode kernel attends with the
        query heads of every attention-DP rank: their sinks, gathered. Under
        decode context parallelism the helper refuses at run time."""
        degree = argument(site.call, "attention_dp")
        dcp = argument(site.call, "dcp_size")
        if not _beyond_one(degree) and not _beyond_one(dcp):
            return None
        gather = "1, None"
        if _beyond_one(degree):
            gather = f"{code_of(degree)}, {code_of(self._dp_group(site, cls, module, ctx, degree))}"
        if DP_SINKS not in helpers:
            helpers.append(DP_SINKS)
        extra = f", dcp_size={code_of(dcp)}" if _beyond_one(dcp) else ""
        return parse_expr(f"_attention_dp_sinks(self.sinks, {gather}{extra})", module)

    def _dp_group(self, site, cls, module, ctx, degree: cst.BaseExpression) -> cst.Attribute:
        """The layer's attention-DP group (``self.<group>``) the decode call passes."""
        group = argument(site.call, "attention_dp_group")
        holder = (
            next((n for n in walk(group) if isinstance(n, cst.Attribute) and self_attr(n) is not None), None)
            if group is not None and not is_none(group)
            else None
        )
        if holder is None:
            raise ctx.precondition(
                f"{ID}: {site.where(cls)} passes attention_dp={code_of(degree)} but no attention_dp_group "
                "held by the layer (self.<group>) to gather the sinks over",
                site.call,
                module,
            )
        return holder

    def _mappings(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        entries = mapping_entries(module)
        if not entries:
            return module  # the checkpoint keys are mapped in another file of the package
        keys = {e.key for e in entries}
        anchors = [e for e in entries if e.key.endswith(".self_attn.o_proj_weight")]
        if not anchors:
            raise ctx.precondition(f"{ID}: load_weights has no mappings[...self_attn.o_proj_weight] entry")
        additions = {}
        for entry in anchors:
            if entry.key[: -len("o_proj_weight")] + "sinks" in keys:
                continue
            norms = {
                entry.key[: -len("o_proj_weight")] + f"{n}.{t}"
                for n in ("q_norm", "k_norm")
                for t in ("weight", "bias")
            }
            # after the q/k norms' entries, wherever qk-norm put them: the two codemods commute
            after = [entry, *(e for e in entries if e.key in norms)][-1]
            key = replace_string_suffix(entry.key_node, "o_proj_weight", "sinks")
            additions[id(after.statement)] = [entry_statement(entry, key, key)]
        return insert_many_after(module, additions)


def _beyond_one(degree: cst.BaseExpression | None) -> bool:
    """Whether a parallel-degree argument may exceed 1 (absent or a literal 1 cannot)."""
    return degree is not None and not (isinstance(degree, cst.Integer) and degree.value == "1")


def _mentions_qk_norm(stmt: cst.BaseStatement) -> bool:
    return any(
        isinstance(n, cst.Attribute) and n.attr.value in ("q_norm", "k_norm") and dotted(n.value) == "self"
        for n in walk(stmt)
    )


def _after(edits: dict, anchor: cst.CSTNode, new: list[cst.BaseStatement]) -> None:
    """Record the insertion of ``new`` after ``anchor``, after earlier insertions there."""
    previous = edits.get(id(anchor))

    def place(updated, previous=previous, new=new):
        base = previous(updated) if previous is not None else updated
        nodes = list(base.nodes) if isinstance(base, cst.FlattenSentinel) else [base]
        return cst.FlattenSentinel([*nodes, *new])

    edits[id(anchor)] = place
