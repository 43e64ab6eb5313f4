"""add-qkv-bias: Q/K/V projection bias, and optionally an output-projection bias."""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from autoport_cst.transform import Codemod, Example, FileContext, PortContext
from autoport_cst.transform.cst_helpers import (
    classes_with_role,
    code_of,
    dotted,
    ensure_import_from,
    insert_many_after,
    is_call,
    is_none,
    keyword_arg,
    map_strings,
    parse_expr,
    parse_statement,
    positional_args,
    replace_string_suffix,
    rewrite,
    self_assignment,
    self_attr,
    walk,
)
from autoport_cst.transform.mappings import entry_statement, mapping_entries

WEIGHT_LOADERS = "vllm_neuron.utils.weight_loader"

BIAS_LOADER = '''
def fused_qkv_bias_loader(q_size, kv_size, num_shards, num_kv_replicas=1):
    """Loader for a fused [q | k | v] bias from separate q, k and v bias tensors.

    Each rank takes its slice of the query bias, and the slice of the key and
    value biases of the KV head it holds (ranks share a KV head when there are
    fewer KV heads than ranks).
    """

    def transform(slices, rank):
        if len(slices) != 3:
            raise ValueError(f"fused QKV bias expects q, k and v tensors, got {len(slices)}")
        q_rank = rank % num_shards
        kv_rank = q_rank // num_kv_replicas
        q = slices[0][q_rank * q_size : (q_rank + 1) * q_size]
        k = slices[1][kv_rank * kv_size : (kv_rank + 1) * kv_size]
        v = slices[2][kv_rank * kv_size : (kv_rank + 1) * kv_size]
        return torch.cat([q, k, v], dim=0)

    return SafetensorsWeightLoader(transform)
'''


@dataclass(frozen=True)
class AddQkvBiasParams:
    qkv: bool = field(default=True, metadata={"doc": "Add the fused Q/K/V bias."})
    o: bool = field(default=False, metadata={"doc": "Add the output-projection bias."})


class AddQkvBias(Codemod):
    """Give attention a fused Q/K/V bias and, optionally, an output-projection bias.

    In the attention class (``<Prefix>Attention``):

    - ``__init__``: ``self.qkv_proj_bias`` (zeros, sized like the last
      dimension of ``self.qkv_proj_weight``) and, with ``o``,
      ``self.o_proj_bias`` (sized like the last dimension of
      ``self.o_proj_weight``), right after the weights;
    - weight loaders: the Q/K/V bias is loaded with ``fused_qkv_bias_loader``
      (added to the model file: it fuses the separate ``q_proj.bias``,
      ``k_proj.bias`` and ``v_proj.bias`` checkpoint tensors into this rank's
      slice, with the same sizes, shard count and KV replication as the weight
      loader); the O bias with ``scaled_bias_loader(scale=<TP shards>)``,
      because the output projection's partial sums are added across ranks;
    - prefill: ``bias=`` of ``NF.qkv_proj`` and the bias argument of
      ``NF.o_proj`` get ``<bias>.unsqueeze(0)``;
    - decode: ``bias_qkv=`` and ``bias_out=`` of ``NF.attention_decode`` get
      ``<bias>.unsqueeze(0)`` (the megakernel wants 2-D biases).

    In ``load_weights``, the mapping gains ``...self_attn.qkv_proj_bias`` ->
    the list of q/k/v ``.bias`` keys, and ``...self_attn.o_proj_bias`` -> the
    ``o_proj.bias`` key, derived from the weights' entries.

    Preconditions: an attention class with ``self.qkv_proj_weight`` (and
    ``self.o_proj_weight`` for ``o``) created as ``nn.Parameter(...)``, their
    ``set_weight_loader`` calls, the ``NF.qkv_proj`` / ``NF.o_proj`` /
    ``NF.attention_decode`` calls, and the weights' mapping entries. Parts
    already present are left as they are.
    """

    ID = "add-qkv-bias"
    REALIZES = ("attention.qkv_bias", "attention.o_bias")
    Params = AddQkvBiasParams
    AFTER = ("unsqueeze-decode-biases",)
    EXAMPLES = (
        Example(
            title="Q/K/V bias (Qwen2-style: no O bias)",
            params={"qkv": True, "o": False},
            before="""
                from vllm_neuron.utils.weight_loader import fused_qkv_weight_loader, set_weight_loader


                class LlamaAttention(nn.Module):
                    def __init__(self, config):
                        qkv_size = self.q_size + 2 * self.kv_size
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, qkv_size, dtype=self.dtype))
                        set_weight_loader(
                            self.qkv_proj_weight,
                            fused_qkv_weight_loader(
                                q_size=self.q_size,
                                kv_size=self.kv_size,
                                shard_dim=1,
                                num_shards=self.world_size,
                                is_storage_transposed=True,
                                num_kv_replicas=self.num_kv_replicas,
                            ),
                        )

                    def forward_prefill(self, x):
                        qkv = NF.qkv_proj(hidden=x, qkv_weights=self.qkv_proj_weight, bias=None)
                        return NF.o_proj(qkv, self.o_proj_weight, None)

                    def forward_decode(self, x):
                        return NF.attention_decode(X=x, W_qkv=self.qkv_proj_weight, bias_qkv=None, bias_out=None)


                class LlamaForCausalLM(nn.Module):
                    def load_weights(self, path):
                        mappings = {}
                        for layer_id in range(2):
                            prefix = f"model.layers.{layer_id}"
                            mappings[f"{prefix}.self_attn.qkv_proj_weight"] = [
                                f"{prefix}.self_attn.q_proj.weight",
                                f"{prefix}.self_attn.k_proj.weight",
                                f"{prefix}.self_attn.v_proj.weight",
                            ]
            """,
            after='''
                from vllm_neuron.utils.weight_loader import SafetensorsWeightLoader, fused_qkv_weight_loader, set_weight_loader


                class LlamaAttention(nn.Module):
                    def __init__(self, config):
                        qkv_size = self.q_size + 2 * self.kv_size
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, qkv_size, dtype=self.dtype))
                        self.qkv_proj_bias = nn.Parameter(torch.zeros(qkv_size, dtype=self.dtype))
                        set_weight_loader(
                            self.qkv_proj_weight,
                            fused_qkv_weight_loader(
                                q_size=self.q_size,
                                kv_size=self.kv_size,
                                shard_dim=1,
                                num_shards=self.world_size,
                                is_storage_transposed=True,
                                num_kv_replicas=self.num_kv_replicas,
                            ),
                        )
                        set_weight_loader(
                            self.qkv_proj_bias,
                            fused_qkv_bias_loader(
                                q_size=self.q_size,
                                kv_size=self.kv_size,
                                num_shards=self.world_size,
                                num_kv_replicas=self.num_kv_replicas,
                            ),
                        )

                    def forward_prefill(self, x):
                        qkv = NF.qkv_proj(hidden=x, qkv_weights=self.qkv_proj_weight, bias=self.qkv_proj_bias.unsqueeze(0))
                        return NF.o_proj(qkv, self.o_proj_weight, None)

                    def forward_decode(self, x):
                        return NF.attention_decode(X=x, W_qkv=self.qkv_proj_weight, bias_qkv=self.qkv_proj_bias.unsqueeze(0), bias_out=None)


                def fused_qkv_bias_loader(q_size, kv_size, num_shards, num_kv_replicas=1):
                    """Loader for a fused [q | k | v] bias from separate q, k and v bias tensors.

                    Each rank takes its slice of the query bias, and the slice of the key and
                    value biases of the KV head it holds (ranks share a KV head when there are
                    fewer KV heads than ranks).
                    """

                    def transform(slices, rank):
                        if len(slices) != 3:
                            raise ValueError(f"fused QKV bias expects q, k and v tensors, got {len(slices)}")
                        q_rank = rank % num_shards
                        kv_rank = q_rank // num_kv_replicas
                        q = slices[0][q_rank * q_size : (q_rank + 1) * q_size]
                        k = slices[1][kv_rank * kv_size : (kv_rank + 1) * kv_size]
                        v = slices[2][kv_rank * kv_size : (kv_rank + 1) * kv_size]
                        return torch.cat([q, k, v], dim=0)

                    return SafetensorsWeightLoader(transform)


                class LlamaForCausalLM(nn.Module):
                    def load_weights(self, path):
                        mappings = {}
                        for layer_id in range(2):
                            prefix = f"model.layers.{layer_id}"
                            mappings[f"{prefix}.self_attn.qkv_proj_weight"] = [
                                f"{prefix}.self_attn.q_proj.weight",
                                f"{prefix}.self_attn.k_proj.weight",
                                f"{prefix}.self_attn.v_proj.weight",
                            ]
                            mappings[f"{prefix}.self_attn.qkv_proj_bias"] = [
                                f"{prefix}.self_attn.q_proj.bias",
                                f"{prefix}.self_attn.k_proj.bias",
                                f"{prefix}.self_attn.v_proj.bias",
                            ]
            ''',
        ),
        Example(
            title="no attention class",
            params={"qkv": True},
            before="""
                class LlamaMLP(nn.Module):
                    pass
            """,
            raises="no attention class",
        ),
    )

    @classmethod
    def realizes(cls, diff) -> bool:
        # adds biases; removing one is a different change
        return diff.path in cls.REALIZES and diff.target is True

    @classmethod
    def params_for(cls, diffs, target, port: PortContext) -> AddQkvBiasParams:
        return AddQkvBiasParams(qkv=target.attention.qkv_bias, o=target.attention.o_bias)

    @classmethod
    def check_params(cls, params: AddQkvBiasParams) -> list[str]:
        if not (params.qkv or params.o):
            return ["nothing to add: set qkv or o"]
        return []

    def transform_module(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        attention = [
            c for c in classes_with_role(module, "attention")
            if "qkv_proj_weight" in _ClassSurvey(c).params
        ]
        if not attention:
            raise ctx.precondition(
                "add-qkv-bias: no attention class (<Prefix>Attention with "
                "self.qkv_proj_weight = nn.Parameter(...)) in this file"
            )
        wanted = [("qkv", "qkv_proj_weight", "qkv_proj_bias")] if self.params.qkv else []
        if self.params.o:
            wanted.append(("o", "o_proj_weight", "o_proj_bias"))
        for cls in attention:
            params = _ClassSurvey(cls).params
            for _, weight, _ in wanted:
                if weight not in params:
                    raise ctx.precondition(
                        f"add-qkv-bias: {cls.name.value} has no self.{weight} = nn.Parameter(...)",
                        cls,
                        module,
                    )
        new_body = []
        needs_loader_fn = needs_scaled_loader = False
        for stmt in module.body:
            if stmt in attention:
                new_cls, added = self._transform_attention(stmt, wanted, module, ctx)
                new_body.append(new_cls)
                added_qkv_loader = "qkv" in added
                needs_loader_fn |= added_qkv_loader
                needs_scaled_loader |= "o" in added
                if added_qkv_loader and not _defines(module, "fused_qkv_bias_loader"):
                    helper = parse_statement(BIAS_LOADER.strip("\n"), module)
                    new_body.append(
                        helper.with_changes(leading_lines=[cst.EmptyLine(indent=False), cst.EmptyLine(indent=False)])
                    )
            else:
                new_body.append(stmt)
        module = module.with_changes(body=new_body)
        if needs_loader_fn:
            module = ensure_import_from(module, WEIGHT_LOADERS, "SafetensorsWeightLoader")
        if needs_scaled_loader:
            module = ensure_import_from(module, WEIGHT_LOADERS, "scaled_bias_loader")
        return self._add_mappings(module, wanted, ctx)

    # -- attention class -------------------------------------------------------

    def _transform_attention(self, cls, wanted, module, ctx):
        survey = _ClassSurvey(cls)
        additions: dict[int, list[cst.BaseStatement]] = {}
        added_loaders: set[str] = set()
        for which, weight_attr, bias_attr in wanted:
            weight_stmt = survey.params[weight_attr]
            if bias_attr not in survey.params:
                additions.setdefault(id(weight_stmt), []).append(
                    _bias_param(weight_stmt, bias_attr, module)
                )
            loader_stmt = survey.loaders.get(weight_attr)
            if loader_stmt is None:
                raise ctx.precondition(
                    f"add-qkv-bias: {cls.name.value} attaches no loader to self.{weight_attr} "
                    f"(set_weight_loader(self.{weight_attr}, ...))",
                    cls,
                    module,
                )
            if bias_attr not in survey.loaders:
                additions.setdefault(id(loader_stmt), []).append(
                    _bias_loader(which, loader_stmt, bias_attr, module)
                )
                added_loaders.add(which)
        wanted_calls = ("NF.qkv_proj", "NF.attention_decode") + (("NF.o_proj",) if self.params.o else ())
        for name in wanted_calls:
            if not survey.calls.get(name):
                raise ctx.precondition(
                    f"add-qkv-bias: {cls.name.value} has no {name}(...) call", cls, module
                )
        edits = {
            key: (lambda updated, new=new: cst.FlattenSentinel([updated, *new]))
            for key, new in additions.items()
        }
        arguments = _BiasArguments(self.params, module)
        for name in wanted_calls:
            for call in survey.calls[name]:
                edits[id(call)] = arguments.edit
        return rewrite(cls, edits), added_loaders

    # -- load_weights ----------------------------------------------------------

    def _add_mappings(self, module, wanted, ctx):
        entries = mapping_entries(module)
        keys = {e.key for e in entries}
        additions = {}
        for _, weight_attr, bias_attr in wanted:
            found = [e for e in entries if e.key.endswith(f".{weight_attr}")]
            if not found:
                raise ctx.precondition(
                    f"add-qkv-bias: load_weights has no mappings[...{weight_attr}] entry"
                )
            for entry in found:
                bias_key_text = entry.key[: -len(weight_attr)] + bias_attr
                if bias_key_text in keys:
                    continue
                key = replace_string_suffix(entry.key_node, weight_attr, bias_attr)
                value = map_strings(entry.value, lambda s: replace_string_suffix(s, ".weight", ".bias"))
                if key is None or value is None:
                    raise ctx.precondition(
                        f"add-qkv-bias: cannot derive the bias keys from the mapping of "
                        f"{entry.key} (expected checkpoint keys ending in .weight)",
                        entry.statement,
                        module,
                    )
                additions[id(entry.statement)] = [entry_statement(entry, key, value)]
        return insert_many_after(module, additions)


class _ClassSurvey:
    """One walk over the attention class: its parameters, loader calls and
    kernel calls."""

    CALLS = ("NF.qkv_proj", "NF.attention_decode", "NF.o_proj")

    def __init__(self, cls: cst.ClassDef) -> None:
        self.params: dict[str, cst.SimpleStatementLine] = {}
        self.loaders: dict[str, cst.SimpleStatementLine] = {}
        self.calls: dict[str, list[cst.Call]] = {}
        for node in walk(cls):
            if isinstance(node, cst.SimpleStatementLine):
                found = self_assignment(node)
                if found is not None:
                    self.params.setdefault(found[0], node)
                small = node.body[0]
                if isinstance(small, cst.Expr) and is_call(small.value, "set_weight_loader"):
                    args = small.value.args
                    attr = self_attr(args[0].value) if args else None
                    if attr is not None:
                        self.loaders.setdefault(attr, node)
            elif isinstance(node, cst.Call):
                for name in self.CALLS:
                    if is_call(node, name):
                        self.calls.setdefault(name, []).append(node)


class _BiasArguments:
    """Pass the biases to the prefill ops and the decode megakernel."""

    def __init__(self, params: AddQkvBiasParams, module: cst.Module) -> None:
        self.params = params
        self.module = module

    def _bias(self, attr: str) -> cst.BaseExpression:
        return parse_expr(f"self.{attr}.unsqueeze(0)", self.module)

    def edit(self, updated: cst.Call) -> cst.Call:
        if self.params.qkv and is_call(updated, "NF.qkv_proj"):
            return _set_keyword(updated, "bias", self._bias("qkv_proj_bias"))
        if self.params.qkv and is_call(updated, "NF.attention_decode"):
            updated = _set_keyword(updated, "bias_qkv", self._bias("qkv_proj_bias"))
        if self.params.o and is_call(updated, "NF.attention_decode"):
            updated = _set_keyword(updated, "bias_out", self._bias("o_proj_bias"))
        if self.params.o and is_call(updated, "NF.o_proj"):
            arg = keyword_arg(updated, "bias")
            positional = positional_args(updated)
            if arg is None and len(positional) >= 3:
                arg = positional[2]
            if arg is None:
                return updated.with_changes(
                    args=[*updated.args, cst.Arg(self._bias("o_proj_bias"))]
                )
            if is_none(arg.value):
                return updated.with_changes(
                    args=[a.with_changes(value=self._bias("o_proj_bias")) if a is arg else a for a in updated.args]
                )
        return updated


def _set_keyword(call: cst.Call, name: str, value: cst.BaseExpression) -> cst.Call:
    """Set ``name=value`` when the argument is absent or None; keep any
    other existing value (already a bias)."""
    arg = keyword_arg(call, name)
    if arg is None:
        new_arg = cst.Arg(
            keyword=cst.Name(name),
            value=value,
            equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")),
        )
        return call.with_changes(args=[*call.args, new_arg])
    if is_none(arg.value):
        return call.with_changes(
            args=[a.with_changes(value=value) if a is arg else a for a in call.args]
        )
    return call


def _bias_param(weight_stmt: cst.SimpleStatementLine, bias_attr: str, module: cst.Module) -> cst.BaseStatement:
    """``self.<bias> = nn.Parameter(torch.zeros(<last weight dim>, dtype=<same>))``."""
    _, value = self_assignment(weight_stmt)
    ctor = value.args[0].value if isinstance(value, cst.Call) and value.args else None
    if not isinstance(ctor, cst.Call):
        raise ValueError("weight is not nn.Parameter(torch.<ctor>(...))")
    dims = positional_args(ctor)
    dtype = keyword_arg(ctor, "dtype")
    size = code_of(dims[-1].value)
    dtype_code = f", dtype={code_of(dtype.value)}" if dtype is not None else ""
    param = dotted(value.func)
    return parse_statement(f"self.{bias_attr} = {param}(torch.zeros({size}{dtype_code}))", module)


def _bias_loader(which: str, loader_stmt, bias_attr: str, module: cst.Module) -> cst.BaseStatement:
    call = loader_stmt.body[0].value
    inner = call.args[1].value if len(call.args) > 1 else None
    if not isinstance(inner, cst.Call):
        raise ValueError("set_weight_loader without a loader call")
    if which == "qkv":
        kept = [
            f"{a.keyword.value}={code_of(a.value)}"
            for a in inner.args
            if a.keyword is not None and a.keyword.value in ("q_size", "kv_size", "num_shards", "num_kv_replicas")
        ]
        args = ",\n        ".join(kept)
        code = (
            f"set_weight_loader(\n    self.{bias_attr},\n    fused_qkv_bias_loader(\n        {args},\n    ),\n)"
        )
    else:
        shards = keyword_arg(inner, "num_shards")
        scale = code_of(shards.value) if shards is not None else "1"
        code = f"set_weight_loader(self.{bias_attr}, scaled_bias_loader(scale={scale}))"
    return parse_statement(code, module)


def _defines(module: cst.Module, name: str) -> bool:
    return any(isinstance(s, cst.FunctionDef) and s.name.value == name for s in module.body)
