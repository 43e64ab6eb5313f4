"""attention-output-gate: the attention output times the sigmoid of a gate projection of the layer input (AfMoE)."""

from __future__ import annotations

import libcst as cst

from autoport_cst.transform import Codemod, Example, FileContext, NoParams, PortContext
from autoport_cst.transform.anatomy.attention import DECODE, SEGMENTED_CP, attention_classes_in, kernel_sites
from autoport_cst.transform.anatomy.classes import is_quantized, require_method
from autoport_cst.transform.anatomy.loaders import RANK_WRAPPERS, find_loaders
from autoport_cst.transform.anatomy.mappings import entry_statement, mapping_entries
from autoport_cst.transform.anatomy.qkv import forward_methods, projections
from autoport_cst.transform.cst.snippets import parse_expr, parse_statements
from autoport_cst.transform.cst.vocabulary import (
    code_of,
    dotted,
    is_none,
    keyword_arg,
    positional_args,
    self_assignment,
    string_text,
    walk,
)
from autoport_cst.transform.edit.arguments import set_keyword
from autoport_cst.transform.edit.functions import add_functions
from autoport_cst.transform.edit.guards import guard_edit
from autoport_cst.transform.edit.imports import ensure_import_from
from autoport_cst.transform.edit.kernels import argument, guard, guard_statement
from autoport_cst.transform.edit.loaders import attach_statement, render_call, render_loader
from autoport_cst.transform.edit.tree import (
    add_edit,
    insert_many_after,
    replace_string_suffix,
    rewrite,
    with_comment,
)
from autoport_cst.transform.realizes import Change, Realizes

ID = "attention-output-gate"
WEIGHT_LOADERS = "vllm_neuron.utils.weight_loader"
GATE = "output_gate_proj_weight"
CHECKPOINT_MODULE = "gate_proj"  # the canonical name; checkpoint-keys renames it to the checkpoint's

PARAMETER_COMMENT = (
    "<-- MODEL-SPECIFIC: the output gate's projection of the layer input, stored [in, out]: "
    "this rank's query heads, as the output projection's rows"
)
LOADER_COMMENT = (
    "<-- MODEL-SPECIFIC: the output gate is sharded by query head, as the output projection's rows"
)
PREFILL_COMMENT = (
    "<-- MODEL-SPECIFIC: the attention output gated (sigmoid of the gate projection) before o_proj"
)
GUARD_COMMENT = "<-- MODEL-SPECIFIC: attention output gate: a path it is not ported to refuses"
CP_MESSAGE = "attention output gate: context-parallel prefill (NF.segmented_attention_cp) is not ported"
DCP_MESSAGE = "attention output gate: decode context parallelism (DCP) is not ported"
QUANTIZED_MESSAGE = "the attention output gate is not ported to the quantized attention class"

OUTPUT_GATED = '''
def _output_gated(attn, hidden, gate_weight):
    """The attention output as NF.o_proj takes it ([B, N, D, S] or
    [B, S, N * D]) times the sigmoid of the output gate: the layer input
    ``hidden`` (its B * S tokens, [..., H]) projected by this rank's gate
    columns ``gate_weight`` [H, N * D], one gate per element of its heads.
    Returns [B, S, N * D]."""
    if attn.dim() == 4:
        batch, heads, d_head, seq = attn.shape
        attn = attn.permute(0, 3, 1, 2).reshape(batch, seq, heads * d_head)
    tokens = hidden.reshape(attn.shape[0], attn.shape[1], -1).to(gate_weight.dtype)
    gate = torch.matmul(tokens, gate_weight)
    return attn * torch.sigmoid(gate).to(attn.dtype)
'''

GATED_DECODE = '''
def _gated_decode_output(result, hidden, gate_weight, w_out, bias_out):
    """The decode kernel's result computed without its output projection
    (W_out=None: the attention [B, N, D, S]), gated, then projected as the
    kernel projects: [B * S, H]. The step's K and V are passed on when the
    kernel returns them."""
    attn, rest = (result[0], tuple(result[1:])) if isinstance(result, tuple) else (result, ())
    output = NF.o_proj(_output_gated(attn, hidden, gate_weight), w_out, bias_out)
    output = output.reshape(-1, output.shape[-1])
    return (output, *rest) if rest else output
'''


class AttentionOutputGate(Codemod):
    """The attention output, per element of every query head and before the
    output projection, multiplied by the sigmoid of a bias-free projection
    of the layer input (AfMoE's ``output * sigmoid(gate_proj(hidden))``).

    Model file, attention class (``<Prefix>Attention``):

    - ``__init__`` creates ``self.output_gate_proj_weight`` right after
      ``self.o_proj_weight``, built from the same ``torch.empty`` sizes
      reversed (``[hidden, this rank's query heads * head_dim]``: stored
      ``[in, out]`` like the QKV weight), same dtype;
    - its loader is attached right after the output projection's and built
      from it: the same ``sharding_weight_loader`` (shard size, ``num_shards``:
      TP, times attention DP where the layer shards query heads over it,
      transposed storage) along the parameter's other dimension
      (``shard_dim=1``), inside the same rank wrapper, so each rank reads the
      gate columns of the heads whose rows of ``o_proj`` it holds;
    - every ``NF.o_proj`` call (the prefill paths: flash and segmented
      attention alike feed it) projects ``_output_gated(<its input>,
      <layer input>, self.output_gate_proj_weight)``, the layer input being what
      the method's ``NF.qkv_proj`` calls project (``hidden=``, one expression
      for all of them);
    - every decode kernel call runs without its output projection
      (``W_out=None``, ``bias_out=None``) inside ``_gated_decode_output(...,
      <its X>, self.output_gate_proj_weight, <its W_out>, <its bias_out>)``, which
      gates the attention and projects it with the kernel's own ``W_out`` (FP8
      V dequantization included). Under attention data parallelism the
      kernel's attention comes back for every rank's batch with this rank's
      heads, which its ``X`` (the gathered batch) and gate columns match;
    - a path the gate is not ported to raises ``NotImplementedError``:
      ``NF.segmented_attention_cp`` (context-parallel prefill), and decode
      with decode context parallelism (a ``dcp_size=`` passed to the kernel
      above 1).

    ``load_weights`` maps ``...self_attn.output_gate_proj_weight`` to the checkpoint
    key beside ``o_proj``'s: ``...self_attn.gate_proj.weight``, the canonical
    name research gives the gate (``checkpoint-keys`` then renames it to the
    checkpoint's own, as for every module).

    Preconditions: ``self.o_proj_weight = nn.Parameter(torch.empty(a, b, ...))``
    with a ``sharding_weight_loader(shard_dim=0, ..., is_storage_transposed=True)``
    attached; in every forward method with an ``NF.o_proj`` call, ``NF.qkv_proj``
    calls that agree on their ``hidden=``; every decode kernel call passes
    ``X`` and ``W_out``; a ``...self_attn.o_proj_weight`` mapping entry where
    ``load_weights`` maps keys.
    """

    ID = ID
    REALIZES = Realizes({"attention.output_gate": Change(to=("sigmoid",), reference=("none",))})
    # the gate sits between the attention kernels and the output projection:
    # every NF.o_proj call and every decode kernel (which fuses it) changes
    TOUCHES = ("attention.output",)
    Params = NoParams
    NEEDS_REAL_MODEL = True
    AFTER = (
        "add-qkv-bias",
        "unsqueeze-decode-biases",
        "qk-norm",
        "attention-sinks",
        "attention-softcap",
        "sliding-window",
    )
    EXAMPLES = (
        Example(
            title="prefill and decode of a layer sharding query heads over TP x attention DP (Qwen3-MoE)",
            before="""
                import torch
                from vllm_neuron.utils.weight_loader import set_weight_loader, sharding_weight_loader


                class Qwen3MoeAttention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, qkv_size, dtype=self.dtype))
                        self.o_proj_weight = nn.Parameter(torch.empty(o_in, self.hidden_size, dtype=self.dtype))
                        self._setup_weight_loaders()

                    def _setup_weight_loaders(self):
                        o_loader = sharding_weight_loader(
                            shard_dim=0, shard_size=o_shard_size, num_shards=shards, is_storage_transposed=True
                        )
                        o_loader = with_rank_override(o_loader, rank=effective_q_rank)
                        set_weight_loader(self.o_proj_weight, o_loader)

                    def forward_prefill(self, hidden_states, cos, sin, kv_segment_size):
                        if kv_segment_size:
                            q = NF.qkv_proj(hidden=hidden_states.unsqueeze(0), qkv_weights=self.qkv_proj_weight)
                            attn_output = NF.segmented_attention(q, k_cache=self.k_cache, v_cache=self.v_cache)
                        else:
                            qkv = NF.qkv_proj(hidden=hidden_states.unsqueeze(0), qkv_weights=self.qkv_proj_weight)
                            attn_output = NF.flash_attention(q, k, v, scale=self.scaling)
                        attn_output = NF.o_proj(attn_output.unsqueeze(0), self.o_proj_weight, None).squeeze(0)
                        return attn_output

                    def forward_decode(self, x):
                        output = NF.attention_decode(
                            X=x,
                            W_qkv=self.qkv_proj_weight,
                            W_out=self.o_proj_weight / self.v_scale_float,
                            bias_out=None,
                            attention_dp=self.attention_dp_size,
                        )
                        return self.attn_tp_group.all_reduce(output)


                class Qwen3MoeForCausalLM(nn.Module):
                    def load_weights(self, path):
                        for layer_id in range(2):
                            prefix = f"model.layers.{layer_id}"
                            mappings[f"{prefix}.self_attn.o_proj_weight"] = f"{prefix}.self_attn.o_proj.weight"
            """,
            after='''
                import torch
                from vllm_neuron.utils.weight_loader import set_weight_loader, sharding_weight_loader


                def _gated_decode_output(result, hidden, gate_weight, w_out, bias_out):
                    """The decode kernel's result computed without its output projection
                    (W_out=None: the attention [B, N, D, S]), gated, then projected as the
                    kernel projects: [B * S, H]. The step's K and V are passed on when the
                    kernel returns them."""
                    attn, rest = (result[0], tuple(result[1:])) if isinstance(result, tuple) else (result, ())
                    output = NF.o_proj(_output_gated(attn, hidden, gate_weight), w_out, bias_out)
                    output = output.reshape(-1, output.shape[-1])
                    return (output, *rest) if rest else output


                def _output_gated(attn, hidden, gate_weight):
                    """The attention output as NF.o_proj takes it ([B, N, D, S] or
                    [B, S, N * D]) times the sigmoid of the output gate: the layer input
                    ``hidden`` (its B * S tokens, [..., H]) projected by this rank's gate
                    columns ``gate_weight`` [H, N * D], one gate per element of its heads.
                    Returns [B, S, N * D]."""
                    if attn.dim() == 4:
                        batch, heads, d_head, seq = attn.shape
                        attn = attn.permute(0, 3, 1, 2).reshape(batch, seq, heads * d_head)
                    tokens = hidden.reshape(attn.shape[0], attn.shape[1], -1).to(gate_weight.dtype)
                    gate = torch.matmul(tokens, gate_weight)
                    return attn * torch.sigmoid(gate).to(attn.dtype)


                class Qwen3MoeAttention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, qkv_size, dtype=self.dtype))
                        self.o_proj_weight = nn.Parameter(torch.empty(o_in, self.hidden_size, dtype=self.dtype))
                        # <-- MODEL-SPECIFIC: the output gate's projection of the layer input, stored [in, out]: this rank's query heads, as the output projection's rows
                        self.output_gate_proj_weight = nn.Parameter(torch.empty(self.hidden_size, o_in, dtype=self.dtype))
                        self._setup_weight_loaders()

                    def _setup_weight_loaders(self):
                        o_loader = sharding_weight_loader(
                            shard_dim=0, shard_size=o_shard_size, num_shards=shards, is_storage_transposed=True
                        )
                        o_loader = with_rank_override(o_loader, rank=effective_q_rank)
                        set_weight_loader(self.o_proj_weight, o_loader)
                        # <-- MODEL-SPECIFIC: the output gate is sharded by query head, as the output projection's rows
                        set_weight_loader(
                            self.output_gate_proj_weight,
                            with_rank_override(
                                sharding_weight_loader(
                                    shard_dim=1,
                                    shard_size=o_shard_size,
                                    num_shards=shards,
                                    is_storage_transposed=True,
                                ),
                                rank=effective_q_rank,
                            ),
                        )

                    def forward_prefill(self, hidden_states, cos, sin, kv_segment_size):
                        if kv_segment_size:
                            q = NF.qkv_proj(hidden=hidden_states.unsqueeze(0), qkv_weights=self.qkv_proj_weight)
                            attn_output = NF.segmented_attention(q, k_cache=self.k_cache, v_cache=self.v_cache)
                        else:
                            qkv = NF.qkv_proj(hidden=hidden_states.unsqueeze(0), qkv_weights=self.qkv_proj_weight)
                            attn_output = NF.flash_attention(q, k, v, scale=self.scaling)
                        # <-- MODEL-SPECIFIC: the attention output gated (sigmoid of the gate projection) before o_proj
                        attn_output = NF.o_proj(_output_gated(attn_output.unsqueeze(0), hidden_states.unsqueeze(0), self.output_gate_proj_weight), self.o_proj_weight, None).squeeze(0)
                        return attn_output

                    def forward_decode(self, x):
                        output = _gated_decode_output(NF.attention_decode(
                            X=x,
                            W_qkv=self.qkv_proj_weight,
                            W_out=None,
                            bias_out=None,
                            attention_dp=self.attention_dp_size,
                        ), x, self.output_gate_proj_weight, self.o_proj_weight / self.v_scale_float, None)
                        return self.attn_tp_group.all_reduce(output)


                class Qwen3MoeForCausalLM(nn.Module):
                    def load_weights(self, path):
                        for layer_id in range(2):
                            prefix = f"model.layers.{layer_id}"
                            mappings[f"{prefix}.self_attn.o_proj_weight"] = f"{prefix}.self_attn.o_proj.weight"
                            mappings[f"{prefix}.self_attn.output_gate_proj_weight"] = f"{prefix}.self_attn.gate_proj.weight"
            ''',
        ),
        Example(
            title="a decode kernel that does not project the output itself is refused",
            before="""
                class LlamaAttention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, qkv_size))
                        self.o_proj_weight = nn.Parameter(torch.empty(o_in, self.hidden_size))
                        set_weight_loader(
                            self.o_proj_weight,
                            sharding_weight_loader(shard_dim=0, shard_size=o_in, num_shards=tp, is_storage_transposed=True),
                        )

                    def forward_decode(self, x):
                        return NF.attention_decode(X=x, W_qkv=self.qkv_proj_weight)
            """,
            raises="attention-output-gate: the decode kernel call in LlamaAttention.forward_decode passes no W_out",
        ),
    )

    @classmethod
    def params_for(cls, diffs, target, port: PortContext) -> NoParams:
        return NoParams()

    def transform_module(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        edits: dict = {}
        needs: set[str] = set()
        for cls in attention_classes_in(module, ctx):
            if is_quantized(cls):
                for key, edit in guard_edit(cls, QUANTIZED_MESSAGE, module).items():
                    add_edit(edits, key, edit)
                for site in kernel_sites(cls):
                    ctx.unaffected(site.call, f"guarded: {QUANTIZED_MESSAGE}")
                for call in _o_proj_calls(cls):
                    ctx.unaffected(call, f"guarded: {QUANTIZED_MESSAGE}")
                continue
            if _has_gate(cls):
                continue
            self._parameter_edits(cls, module, ctx, edits)
            needs |= self._output_edits(cls, module, ctx, edits)
        if not edits:
            return module
        module = rewrite(module, edits)
        if needs:
            module = add_functions(module, [OUTPUT_GATED] + ([GATED_DECODE] if "decode" in needs else []))
        for name in ("sharding_weight_loader", "set_weight_loader"):
            module = ensure_import_from(module, WEIGHT_LOADERS, name)
        return self._mappings(module, ctx)

    # -- the parameter and its loader -------------------------------------------------------

    def _parameter_edits(self, cls: cst.ClassDef, module: cst.Module, ctx: FileContext, edits: dict) -> None:
        """``self.output_gate_proj_weight`` after ``self.o_proj_weight`` (its sizes
        reversed), its loader after the output projection's (the other
        dimension of the same shards, read at the same rank)."""
        name = cls.name.value
        init = require_method(module, ctx, cls, "__init__")
        o_stmt, sizes, rest = _o_proj_parameter(init)
        if o_stmt is None:
            raise ctx.precondition(
                f"{ID}: {name}.__init__ creates no self.o_proj_weight = nn.Parameter(torch.empty(a, b, ...)) "
                "(the gate's sizes are the output projection's, reversed)",
                init,
                module,
            )
        reversed_args = ", ".join([code_of(sizes[1]), code_of(sizes[0]), *rest])
        new = parse_statements(f"self.{GATE} = nn.Parameter(torch.empty({reversed_args}))\n", module)
        _after(edits, o_stmt, [with_comment(new[0], PARAMETER_COMMENT)])
        o_proj = next(iter(find_loaders(cls).get("o_proj_weight", [])), None)
        base = o_proj.base if o_proj is not None else None
        shard_dim = keyword_arg(base, "shard_dim") if base is not None else None
        transposed = keyword_arg(base, "is_storage_transposed") if base is not None else None
        if (
            base is None
            or dotted(base.func) != "sharding_weight_loader"
            or shard_dim is None
            or code_of(shard_dim.value) != "0"
            or transposed is None
            or code_of(transposed.value) != "True"
        ):
            problem = o_proj.problem if o_proj is not None and o_proj.problem else None
            raise ctx.precondition(
                f"{ID}: {name} attaches no sharding_weight_loader(shard_dim=0, ..., is_storage_transposed=True) "
                f"to self.o_proj_weight ({problem or 'the gate is sharded like it, along its other dimension'})",
                o_proj.statement if o_proj is not None else cls,
                module,
            )
        assert o_proj is not None
        wrappers = tuple(w for w in o_proj.wrappers if dotted(w.func) in RANK_WRAPPERS)
        arguments = ["shard_dim=1" if a is shard_dim else _arg_text(a) for a in base.args]
        loader = render_loader(render_call("sharding_weight_loader", arguments, 1 + len(wrappers)), wrappers)
        _after(
            edits, o_proj.statement, [with_comment(attach_statement(GATE, loader, module), LOADER_COMMENT)]
        )

    # -- the output projections --------------------------------------------------------------

    def _output_edits(self, cls: cst.ClassDef, module: cst.Module, ctx: FileContext, edits: dict) -> set[str]:
        """The gate on every ``NF.o_proj`` and every decode kernel call;
        returns which helpers the module needs (``prefill``, ``decode``)."""
        name = cls.name.value
        needs: set[str] = set()
        sites = kernel_sites(cls)
        for site in sites:
            if site.kind == SEGMENTED_CP:
                guard(module, ctx, site, "True", CP_MESSAGE, edits, GUARD_COMMENT)
        for method in forward_methods(cls):
            calls = [c for c in _o_proj_calls(method)]
            if not calls:
                continue
            hidden = _layer_input(cls, method, module, ctx)
            for call in calls:
                first = positional_args(call)
                if not first:
                    raise ctx.precondition(
                        f"{ID}: the NF.o_proj call in {name}.{method.name.value} passes its input by keyword",
                        call,
                        module,
                    )
                gated = parse_expr(f"_output_gated({code_of(first[0].value)}, {hidden}, self.{GATE})", module)
                add_edit(edits, id(call), lambda updated, gated=gated: _with_first_arg(updated, gated))
                holder = _statement_of(method, call)
                if holder is not None:
                    add_edit(edits, id(holder), lambda updated: with_comment(updated, PREFILL_COMMENT))
                needs.add("prefill")
        decodes = [s for s in sites if s.kind == DECODE]
        for site in decodes:
            self._decode_edit(cls, site, module, ctx, edits)
            needs |= {"prefill", "decode"}
        if not needs:
            raise ctx.precondition(f"{ID}: no NF.o_proj(...) nor decode kernel call in {name}", cls, module)
        return needs

    def _decode_edit(self, cls, site, module: cst.Module, ctx: FileContext, edits: dict) -> None:
        """The decode kernel without its output projection, its attention
        gated and projected by ``_gated_decode_output``."""
        where = site.where(cls)
        x = argument(site.call, "X", 0)
        w_out = argument(site.call, "W_out")
        if x is None:
            raise ctx.precondition(f"{ID}: the decode kernel call in {where} passes no X", site.call, module)
        if w_out is None or is_none(w_out):
            raise ctx.precondition(
                f"{ID}: the decode kernel call in {where} passes no W_out (the gate goes between the "
                "attention and the output projection the kernel fuses)",
                site.call,
                module,
            )
        bias = argument(site.call, "bias_out")
        bias_text = "None" if bias is None else code_of(bias)
        dcp = argument(site.call, "dcp_size")
        if dcp is not None and not (isinstance(dcp, cst.Integer) and dcp.value == "1"):
            guard_statement(
                module, ctx, site.method, site.call, f"{code_of(dcp)} > 1", DCP_MESSAGE, edits, GUARD_COMMENT
            )
        none = cst.Name("None")
        tail = f"{code_of(x)}, self.{GATE}, {code_of(w_out)}, {bias_text}"

        def edit(updated: cst.Call) -> cst.Call:
            bare = set_keyword(set_keyword(updated, "W_out", none), "bias_out", none, after=("W_out",))
            wrapped = parse_expr(f"_gated_decode_output(KERNEL, {tail})", module)
            assert isinstance(wrapped, cst.Call)
            return wrapped.with_changes(args=[wrapped.args[0].with_changes(value=bare), *wrapped.args[1:]])

        add_edit(edits, id(site.call), edit)

    # -- load_weights ------------------------------------------------------------------------

    def _mappings(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        """``...self_attn.output_gate_proj_weight`` after each
        ``...self_attn.o_proj_weight`` entry, its checkpoint key derived from
        that entry's (``...o_proj.weight`` -> ``...gate_proj.weight``)."""
        entries = mapping_entries(module)
        if not entries:
            return module  # the checkpoint keys are mapped in another file of the package
        keys = {e.key for e in entries}
        anchors = [e for e in entries if e.key.endswith(".self_attn.o_proj_weight")]
        if not anchors:
            raise ctx.precondition(f"{ID}: load_weights has no mappings[...self_attn.o_proj_weight] entry")
        additions: dict[int, list[cst.BaseStatement]] = {}
        for entry in anchors:
            if entry.key[: -len("o_proj_weight")] + GATE in keys:
                continue
            key = replace_string_suffix(entry.key_node, "o_proj_weight", GATE)
            value = replace_string_suffix(
                entry.value.with_changes(lpar=[], rpar=[]), "o_proj.weight", f"{CHECKPOINT_MODULE}.weight"
            )
            if key is None or value is None or string_text(value) is None:
                raise ctx.precondition(
                    f"{ID}: cannot derive the gate's checkpoint key from the mapping of {entry.key} "
                    "(expected one checkpoint key ending in o_proj.weight)",
                    entry.statement,
                    module,
                )
            additions[id(entry.statement)] = [entry_statement(entry, key, value)]
        return insert_many_after(module, additions)


def _has_gate(cls: cst.ClassDef) -> bool:
    return any((pair := self_assignment(s)) is not None and pair[0] == GATE for s in _lines(cls))


def _lines(node: cst.CSTNode) -> list[cst.SimpleStatementLine]:
    return [n for n in walk(node) if isinstance(n, cst.SimpleStatementLine)]


def _o_proj_calls(node: cst.CSTNode) -> list[cst.Call]:
    """``NF.o_proj(...)`` calls (a kernel, not a module called through self)."""
    return [
        n
        for n in walk(node)
        if isinstance(n, cst.Call)
        and (name := dotted(n.func)) is not None
        and not name.startswith("self.")
        and name.rsplit(".", 1)[-1] == "o_proj"
    ]


def _o_proj_parameter(init: cst.FunctionDef):
    """(statement, the two sizes, the other arguments' code) of
    ``self.o_proj_weight = nn.Parameter(torch.empty(a, b, ...))``."""
    for stmt in _lines(init):
        pair = self_assignment(stmt)
        if pair is None or pair[0] != "o_proj_weight" or not isinstance(pair[1], cst.Call):
            continue
        inner = positional_args(pair[1])
        empty = inner[0].value if inner else None
        if not isinstance(empty, cst.Call) or dotted(empty.func) not in ("torch.empty", "torch.zeros"):
            return None, (), []
        sizes = positional_args(empty)
        if len(sizes) != 2:
            return None, (), []
        rest = [_arg_text(a) for a in empty.args if a.keyword is not None]
        return stmt, (sizes[0].value, sizes[1].value), rest
    return None, (), []


def _arg_text(arg: cst.Arg) -> str:
    value = code_of(arg.value).strip()
    return f"{arg.keyword.value}={value}" if arg.keyword is not None else value


def _layer_input(cls: cst.ClassDef, method: cst.FunctionDef, module: cst.Module, ctx: FileContext) -> str:
    """The layer input the method's QKV projections read (their ``hidden=``),
    one expression for all of them."""
    where = f"{cls.name.value}.{method.name.value}"
    found = {
        code_of(arg.value)
        for p in projections(cls)
        if p.method is method and p.kind == "prefill" and (arg := keyword_arg(p.call, "hidden")) is not None
    }
    if len(found) != 1:
        raise ctx.precondition(
            f"{ID}: cannot tell the layer input the gate projects in {where}: "
            + (
                f"its NF.qkv_proj calls read {', '.join(sorted(found))}"
                if found
                else "no NF.qkv_proj(hidden=...) call"
            ),
            method,
            module,
        )
    return found.pop()


def _with_first_arg(call: cst.Call, value: cst.BaseExpression) -> cst.Call:
    args = list(call.args)
    index = next(i for i, a in enumerate(args) if a.keyword is None)
    if dotted(args[index].value.func if isinstance(args[index].value, cst.Call) else args[index].value) == (
        "_output_gated"
    ):
        return call
    args[index] = args[index].with_changes(value=value)
    return call.with_changes(args=args)


def _statement_of(method: cst.FunctionDef, call: cst.Call) -> cst.SimpleStatementLine | None:
    holders = [s for s in _lines(method) if any(n is call for n in walk(s))]
    return holders[-1] if holders else None


def _after(edits: dict, anchor: cst.CSTNode, new: list[cst.BaseStatement]) -> None:
    """Record the insertion of ``new`` after ``anchor``, after earlier insertions there."""
    previous = edits.get(id(anchor))

    def place(updated, previous=previous, new=new):
        base = previous(updated) if previous is not None else updated
        nodes = list(base.nodes) if isinstance(base, cst.FlattenSentinel) else [base]
        return cst.FlattenSentinel([*nodes, *new])

    edits[id(anchor)] = place
