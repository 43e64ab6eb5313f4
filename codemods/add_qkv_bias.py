"""add-qkv-bias: Q/K/V projection bias, and optionally an output-projection bias."""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from autoport_cst.spec.pitfalls import Pitfall
from autoport_cst.transform import Codemod, Example, FileContext, PortContext
from autoport_cst.transform.anatomy.attention import attention_classes_in, self_parameters
from autoport_cst.transform.anatomy.classes import is_quantized
from autoport_cst.transform.anatomy.mappings import entry_statement, mapping_entries
from autoport_cst.transform.anatomy.qkv import (
    ATTENTION_DP,
    QKV_SHARDING,
    forward_methods,
    function_parameters,
    projection_kind,
    projections,
    qkv_loader_arguments,
    stray_reads,
)
from autoport_cst.transform.cst.snippets import parse_expr, parse_statement
from autoport_cst.transform.cst.vocabulary import (
    code_of,
    dotted,
    is_call,
    is_none,
    keyword_arg,
    positional_args,
    self_assignment,
    walk,
)
from autoport_cst.transform.edit.guards import declare_guarded, guard_edit
from autoport_cst.transform.edit.imports import ensure_import_from
from autoport_cst.transform.edit.loaders import LoaderEdits, attach_statement
from autoport_cst.transform.edit.qkv import BIAS_LOADER_DP
from autoport_cst.transform.edit.rope_columns import append_after
from autoport_cst.transform.edit.tree import (
    add_edit,
    insert_many_after,
    map_strings,
    replace_string_suffix,
    rewrite,
)
from autoport_cst.transform.realizes import Realizes, to

ID = "add-qkv-bias"
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

    In each attention class (``<Prefix>Attention``) of each model file:

    - ``__init__``: ``self.qkv_proj_bias`` (zeros, sized like the last
      dimension of ``self.qkv_proj_weight``) and, with ``o``,
      ``self.o_proj_bias`` (sized like the last dimension of
      ``self.o_proj_weight``), right after the weights;
    - weight loaders, right after each weight's (wherever it is attached:
      a local bound to the loader, inside ``with_rank_override``): the Q/K/V
      bias is loaded with ``fused_qkv_bias_loader`` (added to the model file),
      given the sharding arguments of the weight's ``fused_qkv_weight_loader``
      (sizes, shard count, KV replication, and attention data parallelism:
      the query rank ``attention_dp_rank + tp_rank * attention_dp_size``, KV
      heads sharded over DP too when ``kv_sharded_across_attention_dp``), so
      each rank holds the bias of the rows of its weight; the O bias with
      ``scaled_bias_loader(scale=<the O weight's num_shards>)``, because the
      output projection's partial sums are added over those ranks; both
      inside the weight's rank wrappers;
    - every projection: ``bias=`` of each ``NF.qkv_proj`` (the plain prefill
      and the chunked-prefill ``use_block_kv`` one) and the bias argument of
      ``NF.o_proj`` get ``<bias>.unsqueeze(0)``; ``bias_qkv=`` and
      ``bias_out=`` of each decode kernel call (``NF.attention_decode`` or its
      op-by-op substitute) likewise (the megakernel wants 2-D biases).

    In ``load_weights`` (of every file that maps the attention), the mapping
    gains ``...self_attn.qkv_proj_bias`` -> the list of q/k/v ``.bias`` keys,
    and ``...self_attn.o_proj_bias`` -> the ``o_proj.bias`` key, derived from
    the weights' entries.

    Preconditions: an attention class with ``self.qkv_proj_weight`` (and
    ``self.o_proj_weight`` for ``o``) created as ``nn.Parameter(...)``, their
    loaders (``fused_qkv_weight_loader`` with no argument the bias loader
    does not know; an O loader naming ``num_shards``), the ``NF.qkv_proj`` /
    ``NF.o_proj`` / decode kernel calls, no other computation with those
    weights in a forward method (it would go without the bias), and the
    weights' mapping entries. A quantized attention class (FP8 kernels) is
    guarded: its ``__init__`` raises ``NotImplementedError`` naming the bias.
    Parts already present are left as they are.
    """

    ID = ID
    # adds biases; removing one is a different change
    REALIZES = Realizes({"attention.qkv_bias": to(True), "attention.o_bias": to(True)})
    Params = AddQkvBiasParams
    PITFALLS = (
        Pitfall(
            40,
            lambda spec, facts: spec.attention.qkv_bias or spec.attention.o_bias,
            "attention biases: pass them 2-D ([1, size]) to NF.qkv_proj / NF.attention_decode; a fused "
            "QKV bias needs its own per-rank loader",
        ),
        Pitfall(
            50,
            lambda spec, facts: spec.attention.o_bias,
            "o_proj bias is added after the cross-rank sum: load it divided by the TP degree",
        ),
    )
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
            title="attention data parallelism, a rank override, two prefill projections (real vllm_neuron shape)",
            params={"qkv": True, "o": True},
            before="""
                from vllm_neuron.utils.weight_loader import fused_qkv_weight_loader, set_weight_loader, sharding_weight_loader, with_rank_override


                class LlamaAttention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, qkv_size, dtype=self.dtype))
                        self.o_proj_weight = nn.Parameter(torch.empty(o_in, self.hidden_size, dtype=self.dtype))
                        self._setup_weight_loaders()

                    def _setup_weight_loaders(self):
                        ddp = self.attention_dp_size
                        q_rank = self.attention_dp_rank + self.rank * ddp
                        set_weight_loader(
                            self.qkv_proj_weight,
                            fused_qkv_weight_loader(
                                q_size=self.q_size,
                                kv_size=self.kv_size,
                                shard_dim=1,
                                num_shards=self.world_size,
                                is_storage_transposed=True,
                                num_kv_replicas=self.num_kv_replicas,
                                attention_dp_rank=self.attention_dp_rank,
                                attention_dp_size=ddp,
                                kv_sharded_across_attention_dp=self.kv_needs_a2a,
                            ),
                        )
                        set_weight_loader(
                            self.o_proj_weight,
                            with_rank_override(
                                sharding_weight_loader(shard_dim=0, shard_size=o_in, num_shards=self.world_size * ddp),
                                rank=q_rank,
                            ),
                        )

                    def forward_prefill(self, x, cos, sin, kv_segment_size):
                        if kv_segment_size:
                            q, _, _ = NF.qkv_proj(hidden=x, qkv_weights=self.qkv_proj_weight, bias=None, cos_cache=cos, sin_cache=sin, use_block_kv=True)
                        else:
                            q = NF.qkv_proj(hidden=x, qkv_weights=self.qkv_proj_weight, bias=None, cos_cache=cos, sin_cache=sin)
                        return NF.o_proj(q, self.o_proj_weight, None)

                    def forward_decode(self, x):
                        return NF.attention_decode(X=x, W_qkv=self.qkv_proj_weight, bias_qkv=None, W_out=self.o_proj_weight, bias_out=None)


                class LlamaForCausalLM(nn.Module):
                    def load_weights(self, checkpoint_path, device, cache_dir):
                        for layer_id in range(2):
                            prefix = f"model.layers.{layer_id}"
                            mappings[f"{prefix}.self_attn.qkv_proj_weight"] = [
                                f"{prefix}.self_attn.q_proj.weight",
                                f"{prefix}.self_attn.k_proj.weight",
                                f"{prefix}.self_attn.v_proj.weight",
                            ]
                            mappings[f"{prefix}.self_attn.o_proj_weight"] = f"{prefix}.self_attn.o_proj.weight"
            """,
            after='''
                from vllm_neuron.utils.weight_loader import SafetensorsWeightLoader, fused_qkv_weight_loader, scaled_bias_loader, set_weight_loader, sharding_weight_loader, with_rank_override


                class LlamaAttention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, qkv_size, dtype=self.dtype))
                        self.qkv_proj_bias = nn.Parameter(torch.zeros(qkv_size, dtype=self.dtype))
                        self.o_proj_weight = nn.Parameter(torch.empty(o_in, self.hidden_size, dtype=self.dtype))
                        self.o_proj_bias = nn.Parameter(torch.zeros(self.hidden_size, dtype=self.dtype))
                        self._setup_weight_loaders()

                    def _setup_weight_loaders(self):
                        ddp = self.attention_dp_size
                        q_rank = self.attention_dp_rank + self.rank * ddp
                        set_weight_loader(
                            self.qkv_proj_weight,
                            fused_qkv_weight_loader(
                                q_size=self.q_size,
                                kv_size=self.kv_size,
                                shard_dim=1,
                                num_shards=self.world_size,
                                is_storage_transposed=True,
                                num_kv_replicas=self.num_kv_replicas,
                                attention_dp_rank=self.attention_dp_rank,
                                attention_dp_size=ddp,
                                kv_sharded_across_attention_dp=self.kv_needs_a2a,
                            ),
                        )
                        set_weight_loader(
                            self.qkv_proj_bias,
                            fused_qkv_bias_loader(
                                q_size=self.q_size,
                                kv_size=self.kv_size,
                                num_shards=self.world_size,
                                num_kv_replicas=self.num_kv_replicas,
                                attention_dp_rank=self.attention_dp_rank,
                                attention_dp_size=ddp,
                                kv_sharded_across_attention_dp=self.kv_needs_a2a,
                            ),
                        )
                        set_weight_loader(
                            self.o_proj_weight,
                            with_rank_override(
                                sharding_weight_loader(shard_dim=0, shard_size=o_in, num_shards=self.world_size * ddp),
                                rank=q_rank,
                            ),
                        )
                        set_weight_loader(
                            self.o_proj_bias,
                            with_rank_override(scaled_bias_loader(scale=self.world_size * ddp), rank=q_rank),
                        )

                    def forward_prefill(self, x, cos, sin, kv_segment_size):
                        if kv_segment_size:
                            q, _, _ = NF.qkv_proj(hidden=x, qkv_weights=self.qkv_proj_weight, bias=self.qkv_proj_bias.unsqueeze(0), cos_cache=cos, sin_cache=sin, use_block_kv=True)
                        else:
                            q = NF.qkv_proj(hidden=x, qkv_weights=self.qkv_proj_weight, bias=self.qkv_proj_bias.unsqueeze(0), cos_cache=cos, sin_cache=sin)
                        return NF.o_proj(q, self.o_proj_weight, self.o_proj_bias.unsqueeze(0))

                    def forward_decode(self, x):
                        return NF.attention_decode(X=x, W_qkv=self.qkv_proj_weight, bias_qkv=self.qkv_proj_bias.unsqueeze(0), W_out=self.o_proj_weight, bias_out=self.o_proj_bias.unsqueeze(0))


                def fused_qkv_bias_loader(
                    q_size,
                    kv_size,
                    num_shards,
                    num_kv_replicas=1,
                    attention_dp_rank=0,
                    attention_dp_size=1,
                    kv_sharded_across_attention_dp=False,
                ):
                    """Loader for a fused [q | k | v] bias from separate q, k and v bias tensors,
                    sharded like fused_qkv_weight_loader shards the weight.

                    Each rank takes its slice of the query bias, and the slice of the key and
                    value biases of the KV heads it holds (ranks share a KV head when there are
                    fewer KV heads than ranks). With attention data parallelism the query heads
                    are sharded over the TP x DP ranks (query rank ``attention_dp_rank + tp_rank
                    * attention_dp_size``), and the KV heads too when
                    ``kv_sharded_across_attention_dp``.
                    """

                    def transform(slices, rank):
                        if len(slices) != 3:
                            raise ValueError(f"fused QKV bias expects q, k and v tensors, got {len(slices)}")
                        tp_rank = rank % num_shards
                        q_rank = attention_dp_rank + tp_rank * attention_dp_size
                        kv_rank = q_rank if kv_sharded_across_attention_dp else tp_rank // num_kv_replicas
                        q = slices[0][q_rank * q_size : (q_rank + 1) * q_size]
                        k = slices[1][kv_rank * kv_size : (kv_rank + 1) * kv_size]
                        v = slices[2][kv_rank * kv_size : (kv_rank + 1) * kv_size]
                        return torch.cat([q, k, v], dim=0)

                    return SafetensorsWeightLoader(transform)


                class LlamaForCausalLM(nn.Module):
                    def load_weights(self, checkpoint_path, device, cache_dir):
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
                            mappings[f"{prefix}.self_attn.o_proj_weight"] = f"{prefix}.self_attn.o_proj.weight"
                            mappings[f"{prefix}.self_attn.o_proj_bias"] = f"{prefix}.self_attn.o_proj.bias"
            ''',
        ),
        Example(
            title="a projection the bias would not reach",
            params={"qkv": True},
            before="""
                class LlamaAttention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.qkv_proj_weight = nn.Parameter(torch.empty(self.hidden_size, qkv_size, dtype=self.dtype))
                        set_weight_loader(self.qkv_proj_weight, fused_qkv_weight_loader(q_size=self.q_size, kv_size=self.kv_size, num_shards=self.world_size))

                    def forward_prefill(self, x):
                        if self.quantized:
                            return torch.matmul(x, self.qkv_proj_weight)
                        return NF.qkv_proj(hidden=x, qkv_weights=self.qkv_proj_weight, bias=None)

                    def forward_decode(self, x):
                        return NF.attention_decode(X=x, W_qkv=self.qkv_proj_weight, bias_qkv=None)
            """,
            raises="computes with self.qkv_proj_weight outside NF.qkv_proj",
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
    def params_for(cls, diffs, target, port: PortContext) -> AddQkvBiasParams:
        return AddQkvBiasParams(qkv=target.attention.qkv_bias, o=target.attention.o_bias)

    @classmethod
    def check_params(cls, params: AddQkvBiasParams) -> list[str]:
        if not (params.qkv or params.o):
            return ["nothing to add: set qkv or o"]
        return []

    def transform_module(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        wanted = [("qkv", "qkv_proj_weight", "qkv_proj_bias")] if self.params.qkv else []
        if self.params.o:
            wanted.append(("o", "o_proj_weight", "o_proj_bias"))
        attention = attention_classes_in(module, ctx)
        loads = _defines_method(module, "load_weights")
        if not attention:
            return self._add_mappings(module, wanted, ctx, required=False)
        edits: dict = {}
        helper = None
        imports: set[str] = set()
        for cls in attention:
            if is_quantized(cls):
                self._guard(cls, module, ctx, edits)
                continue
            added = self._attention_edits(cls, wanted, module, ctx, edits)
            if "qkv" in added:
                imports.add("SafetensorsWeightLoader")
                if helper is None and function_parameters(module, "fused_qkv_bias_loader") is None:
                    helper = parse_statement(added["qkv"].strip("\n"), module).with_changes(
                        leading_lines=[cst.EmptyLine(indent=False), cst.EmptyLine(indent=False)]
                    )
                    append_after(edits, id(cls), [helper])
            if "o" in added:
                imports.add("scaled_bias_loader")
        module = rewrite(module, edits)
        for name in sorted(imports):
            module = ensure_import_from(module, WEIGHT_LOADERS, name)
        return self._add_mappings(module, wanted, ctx, required=loads)

    def _guard(self, cls, module, ctx, edits) -> None:
        """A quantized attention class (FP8 kernels) raises in ``__init__``:
        its kernels are not given the biases here."""
        parts = [
            w for w, on in (("Q/K/V bias", self.params.qkv), ("output-projection bias", self.params.o)) if on
        ]
        reason = f"{' and '.join(parts)} in the quantized attention {cls.name.value}"
        for key, fn in guard_edit(cls, f"{reason} is not implemented", module).items():
            add_edit(edits, key, fn)
        declare_guarded(cls, ctx, reason)

    # -- attention class -------------------------------------------------------

    def _attention_edits(self, cls, wanted, module, ctx, edits) -> dict[str, str]:
        """Edits of one attention class; returns the helper functions its new
        loaders call (``qkv``: the text of ``fused_qkv_bias_loader``)."""
        name = cls.name.value
        params = self_parameters(cls)
        for _, weight, _ in wanted:
            if weight not in params:
                raise ctx.precondition(f"{ID}: {name} has no self.{weight} = nn.Parameter(...)", cls, module)
        calls = self._projection_calls(cls, wanted, module, ctx)
        loaders = LoaderEdits(module, ctx, cls)
        added: dict[str, str] = {}
        for which, weight_attr, bias_attr in wanted:
            if bias_attr not in params:
                append_after(
                    edits, id(params[weight_attr]), [_bias_param(params[weight_attr], bias_attr, module)]
                )
            if loaders.of(bias_attr):
                continue
            for loader in loaders.require(weight_attr):
                statement, helper = self._bias_loader(which, loader, bias_attr, loaders, module, ctx)
                append_after(edits, id(loader.statement), [statement])
                added[which] = helper
        arguments = _BiasArguments(self.params, module)
        for call in calls:
            add_edit(edits, id(call), arguments.edit)
        return added

    def _projection_calls(self, cls, wanted, module, ctx) -> list[cst.Call]:
        """Every call that projects with a weight getting a bias; any other
        read of those weights in a forward method is refused."""
        name = cls.name.value
        found = projections(cls)
        outputs = [
            n
            for f in forward_methods(cls)
            for n in walk(f)
            if isinstance(n, cst.Call) and is_call(n, "NF.o_proj")
        ]
        for kind, kernel in (("prefill", "NF.qkv_proj"), ("decode", "NF.attention_decode")):
            if not any(p.kind == kind for p in found):
                raise ctx.precondition(f"{ID}: {name} has no {kernel}(...) call", cls, module)
        if self.params.o and not outputs:
            raise ctx.precondition(f"{ID}: {name} has no NF.o_proj(...) call", cls, module)
        calls = [p.call for p in found] + (outputs if self.params.o else [])
        for _, weight, _ in wanted:
            stray = stray_reads(cls, weight, [p.call for p in found] + outputs)
            if stray is not None:
                raise ctx.precondition(
                    f"{ID}: {name} computes with self.{weight} outside NF.qkv_proj, NF.o_proj and the "
                    "decode kernel; that computation would go without the bias",
                    stray,
                    module,
                )
        return calls

    def _bias_loader(self, which, loader, bias_attr, loaders, module, ctx) -> tuple[cst.BaseStatement, str]:
        """The statement attaching the bias's loader (right after ``loader``,
        the weight's attachment, inside the same rank wrappers), sharded as the
        weight is, and the helper function it calls."""
        base = loader.base
        if which == "qkv":
            inner, helper = self._qkv_bias_loader(base, module, ctx)
        else:
            shards = keyword_arg(base, "num_shards")
            if shards is None:
                raise ctx.precondition(
                    f"{ID}: the loader of self.o_proj_weight ({dotted(base.func)}(...)) names no num_shards: "
                    "cannot tell over how many ranks the output projection's partial sums are added (the bias "
                    "is divided by it)",
                    base,
                    module,
                )
            inner, helper = f"scaled_bias_loader(scale={code_of(shards.value).strip()})", ""
        if loader.wrappers:
            code = loaders.sibling_loader(loader, inner.replace("\n", "\n" + "    " * len(loader.wrappers)))
            return attach_statement(bias_attr, code, module), helper
        if which == "qkv":
            return parse_statement(
                f"set_weight_loader(\n    self.{bias_attr},\n    {inner},\n)", module
            ), helper
        return parse_statement(f"set_weight_loader(self.{bias_attr}, {inner})", module), helper

    def _qkv_bias_loader(self, base: cst.Call, module, ctx) -> tuple[str, str]:
        """``fused_qkv_bias_loader(...)`` with the weight loader's sharding
        arguments (attention data parallelism included), and its text."""
        name = dotted(base.func) or ""
        if name.rsplit(".", 1)[-1] != "fused_qkv_weight_loader":
            raise ctx.precondition(
                f"{ID}: the loader of self.qkv_proj_weight is {name}(...), not fused_qkv_weight_loader(...); "
                "cannot tell how to shard a Q/K/V bias like it",
                base,
                module,
            )
        arguments, unknown = qkv_loader_arguments(base)
        if unknown or not {"q_size", "kv_size", "num_shards"} <= set(arguments):
            what = ", ".join(code_of(a).strip() for a in unknown) or "no q_size, kv_size or num_shards"
            raise ctx.precondition(
                f"{ID}: cannot shard a Q/K/V bias like self.qkv_proj_weight: its loader "
                f"fused_qkv_weight_loader(...) takes {what}",
                base,
                module,
            )
        existing = function_parameters(module, "fused_qkv_bias_loader")
        if existing is not None and not set(arguments) <= set(existing):
            missing = ", ".join(sorted(set(arguments) - set(existing)))
            raise ctx.precondition(
                f"{ID}: this file's fused_qkv_bias_loader takes no {missing} (sharding arguments of the "
                "weight's loader)",
                base,
                module,
            )
        kept = "".join(f"        {key}={arguments[key]},\n" for key in QKV_SHARDING if key in arguments)
        helper = BIAS_LOADER_DP if any(key in arguments for key in ATTENTION_DP) else BIAS_LOADER
        return f"fused_qkv_bias_loader(\n{kept}    )", helper

    # -- load_weights ----------------------------------------------------------

    def _add_mappings(self, module, wanted, ctx, required: bool = True):
        entries = mapping_entries(module)
        keys = {e.key for e in entries}
        additions = {}
        for _, weight_attr, bias_attr in wanted:
            found = [e for e in entries if e.key.endswith(f".{weight_attr}")]
            if not found and required:
                raise ctx.precondition(f"add-qkv-bias: load_weights has no mappings[...{weight_attr}] entry")
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


class _BiasArguments:
    """Pass the biases to the prefill ops and the decode megakernel."""

    def __init__(self, params: AddQkvBiasParams, module: cst.Module) -> None:
        self.params = params
        self.module = module

    def _bias(self, attr: str) -> cst.BaseExpression:
        return parse_expr(f"self.{attr}.unsqueeze(0)", self.module)

    def edit(self, updated: cst.Call) -> cst.Call:
        kind = projection_kind(updated)
        if self.params.qkv and kind == "prefill":
            return _set_keyword(updated, "bias", self._bias("qkv_proj_bias"))
        if self.params.qkv and kind == "decode":
            updated = _set_keyword(updated, "bias_qkv", self._bias("qkv_proj_bias"))
        if self.params.o and kind == "decode":
            updated = _set_keyword(updated, "bias_out", self._bias("o_proj_bias"))
        if self.params.o and is_call(updated, "NF.o_proj"):
            arg = keyword_arg(updated, "bias")
            positional = positional_args(updated)
            if arg is None and len(positional) >= 3:
                arg = positional[2]
            if arg is None:
                return updated.with_changes(args=[*updated.args, cst.Arg(self._bias("o_proj_bias"))])
            if is_none(arg.value):
                return updated.with_changes(
                    args=[
                        a.with_changes(value=self._bias("o_proj_bias")) if a is arg else a
                        for a in updated.args
                    ]
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
        return call.with_changes(args=[a.with_changes(value=value) if a is arg else a for a in call.args])
    return call


def _bias_param(
    weight_stmt: cst.SimpleStatementLine, bias_attr: str, module: cst.Module
) -> cst.BaseStatement:
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


def _nodes(updated) -> list:
    return list(updated.nodes) if isinstance(updated, cst.FlattenSentinel) else [updated]


def _defines_method(module: cst.Module, name: str) -> bool:
    """Whether a class of ``module`` defines method ``name``."""
    return any(
        isinstance(member, cst.FunctionDef) and member.name.value == name
        for cls in module.body
        if isinstance(cls, cst.ClassDef)
        for member in cls.body.body
    )
