"""fused-checkpoint: load Q/K/V and gate/up from fused checkpoint tensors."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import libcst as cst

from autoport_cst.spec.pitfalls import Pitfall
from autoport_cst.transform import Codemod, Example, FileContext, PortContext
from autoport_cst.transform.anatomy.classes import is_quantized
from autoport_cst.transform.anatomy.mappings import mapping_entries
from autoport_cst.transform.anatomy.mlp import mlp_classes, mlp_mapping_weights, parse_mlp_call
from autoport_cst.transform.cst.roles import class_role
from autoport_cst.transform.cst.vocabulary import classes_with_role, code_of, dotted, keyword_arg, string_text
from autoport_cst.transform.edit.fused_loaders import (
    FUSED_EXPERTS,
    PART,
    PART_CODE,
    PART_KWARGS,
    PER_EXPERT_GATE_UP,
    QKV_KWARGS,
    QKV_LOADERS,
    QKV_SPLIT,
    QKV_SPLIT_CODE,
    add_function_after,
    entry_param,
    part_loader_edit,
    split_loader_edit,
    subscript_assignments,
)
from autoport_cst.transform.edit.guards import declare_guarded, guard_edit
from autoport_cst.transform.edit.imports import ensure_import_from
from autoport_cst.transform.edit.loaders import LoaderEdits
from autoport_cst.transform.edit.mappings import replace_segment
from autoport_cst.transform.edit.parameters import WEIGHT_LOADERS
from autoport_cst.transform.edit.tree import rewrite
from autoport_cst.transform.realizes import Realizes, not_to, to

GUARD_QKV = "fused-checkpoint: Q/K/V loaded from one fused checkpoint tensor is not implemented for this quantized attention"
GUARD_GATE_UP = "fused-checkpoint: gate and up loaded from one fused checkpoint tensor is not implemented for this quantized MLP"


QKV_EXAMPLE_AFTER = (
    """
from vllm_neuron.utils.weight_loader import SafetensorsWeightLoader, fused_qkv_weight_loader, set_weight_loader


class LlamaAttention(nn.Module):
    def _setup_weight_loaders(self):
        set_weight_loader(
            self.qkv_proj_weight,
            fused_qkv_split_loader(
                q_size=self.q_size,
                kv_size=self.kv_size,
                num_shards=self.world_size,
                is_storage_transposed=True,
                num_kv_replicas=self.num_kv_replicas,
            ),
        )

"""
    + QKV_SPLIT_CODE
    + """

class LlamaForCausalLM(nn.Module):
    def load_weights(self, path):
        mappings = {}
        for layer_id in range(n):
            prefix = f"model.layers.{layer_id}"
            mappings[f"{prefix}.self_attn.qkv_proj_weight"] = f"{prefix}.self_attn.qkv_proj.weight"
"""
)


KV_GROUPS_EXAMPLE_AFTER = (
    """
from vllm_neuron.utils.weight_loader import SafetensorsWeightLoader, fused_qkv_weight_loader, set_weight_loader


class LlamaAttention(nn.Module):
    def _setup_weight_loaders(self):
        set_weight_loader(
            self.qkv_proj_weight,
            fused_qkv_split_loader(
                q_size=self.q_size,
                kv_size=self.kv_size,
                num_shards=self.world_size,
                is_storage_transposed=True,
                num_kv_replicas=self.num_kv_replicas,
                per_head=True,
                head_dim=self.head_dim,
                kv_groups=True,
            ),
        )

"""
    + QKV_SPLIT_CODE
)


@dataclass(frozen=True)
class FusedCheckpointParams:
    qkv: bool = field(default=False, metadata={"doc": "Q, K and V come from one fused checkpoint tensor."})
    qkv_layout: Literal["concatenated", "per_head", "grouped", "kv_groups"] = field(
        default="concatenated",
        metadata={
            "doc": "concatenated: [all q | all k | all v] rows (Phi-3 qkv_proj); per_head: [q k v] rows per head "
            "(GPT-NeoX query_key_value; needs as many KV heads as query heads); grouped: qkv_groups equal "
            "groups, each its share of q, k and v in the order qkv_order (CodeGen); kv_groups: a group per "
            "KV head, its query heads, its key head, its value head (Falcon-40B/180B)."
        },
    )
    qkv_groups: int = field(
        default=4, metadata={"doc": "grouped: the number of groups of rows.", "examples": (4, 8)}
    )
    qkv_order: str = field(
        default="qkv",
        metadata={"doc": "grouped: the order of the parts in a group.", "examples": ("qkv", "qvk")},
    )
    qkv_name: str = field(default="qkv_proj", metadata={"doc": "Checkpoint module name of the fused tensor."})
    gate_up: bool = field(
        default=False, metadata={"doc": "Gate and up come from one fused [gate | up] tensor."}
    )
    gate_up_name: str = field(
        default="gate_up_proj", metadata={"doc": "Checkpoint module name of that tensor."}
    )


class FusedCheckpoint(Codemod):
    """Load the fused QKV parameter and the gate and up parameters from fused checkpoint tensors.

    The reference fuses separate ``q_proj``/``k_proj``/``v_proj`` tensors on
    load. Checkpoints such as Phi-3 store one ``qkv_proj.weight`` (rows: all
    queries, then keys, then values) and one ``gate_up_proj.weight`` (rows:
    gate, then up); GPT-NeoX stores ``query_key_value`` with the rows grouped
    per head (``qkv_layout="per_head"``).

    With ``qkv``, in the attention classes, the loaders built with
    ``fused_qkv_weight_loader`` / ``fused_qkv_bias_loader`` (same sizes, shard
    count, KV replication, transpose and attention data parallelism; any
    other argument is refused by name) become ``fused_qkv_split_loader``
    (added to the model file): each rank reads its query rows and the rows of
    the KV heads it holds from the one tensor. In ``load_weights`` a ``[q, k, v]``
    key list becomes the single fused key (the differing segment replaced by
    ``qkv_name``). With ``gate_up``, in the MLP classes, the gate and up
    parameters' ``sharding_weight_loader`` become ``fused_part_loader(part=0
    or 1, num_parts=2, ...)`` (added to the model file), for weights and
    biases alike, and their keys point at the ``gate_up_name`` tensor.
    Loaders are changed where they are built: a ``for`` loop or a local
    variable that gate and up share is split (each gets its own loader,
    inside the same wrappers such as ``with_rank_override``; the local goes
    when nothing reads it). Every mapping entry of a changed parameter is
    rewritten, copies for variants (``<param>{suffix}``) included, also in a
    file that maps the MLP without defining it (its ``...mlp.gate*`` and
    ``...mlp.up*`` weights). Quantized attention and MLP classes (a call
    passing ``quantization_type=``) are guarded: their ``__init__`` raises
    ``NotImplementedError``.

    Realizes ``checkpoint.qkv`` (``fused``: concatenated; ``fused_per_head``:
    ``qkv_layout="per_head"``; ``fused_grouped``: ``"grouped"``;
    ``fused_kv_groups``: ``"kv_groups"``, the split loader called with
    ``per_head=True, head_dim=self.head_dim, kv_groups=True``: each rank takes
    its query heads and their KV head from the groups, a KV head replicated on
    the ranks that share it) and ``checkpoint.gate_up = fused``.

    Runs after ``add-qkv-bias`` and ``mlp-bias`` (their bias loaders are
    rewritten too). Preconditions: the parameters to change have the expected
    loaders (a fused weight loader with ``shard_dim=1``); a gated MLP for
    ``gate_up``; key lists of three keys differing in one segment. Already
    converted loaders and keys are left alone.
    """

    ID = "fused-checkpoint"
    REALIZES = Realizes(
        {
            "checkpoint.qkv": to("fused", "fused_per_head", "fused_grouped", "fused_kv_groups"),
            "checkpoint.gate_up": to("fused", "fused_per_head"),
            "checkpoint.qkv_groups": not_to(None),
            "checkpoint.qkv_order": not_to(None),
        }
    )
    Params = FusedCheckpointParams
    PITFALLS = (
        Pitfall(
            180,
            lambda spec, facts: spec.checkpoint.qkv == "fused",
            lambda spec, facts: (
                "fused QKV projection in the checkpoint: split it in load_weights"
                + (
                    " laid out per head ([q, k, v] for each head): reorder before splitting"
                    if facts.value("code.qkv_layout") == "per_head_interleaved"
                    else ""
                )
            ),
        ),
        Pitfall(
            190,
            lambda spec, facts: facts.value("code.interleaved_gate_up"),
            "fused gate/up with interleaved columns (gate = even, up = odd): de-interleave at load time",
        ),
        Pitfall(
            191,
            lambda spec, facts: (
                not facts.value("code.interleaved_gate_up") and spec.checkpoint.gate_up == "fused"
            ),
            "fused gate/up projection: split it into gate and up halves at load time",
        ),
    )
    AFTER = ("add-qkv-bias", "mlp-bias", "mlp-kind")
    EXAMPLES = (
        Example(
            title="Phi-3: fused qkv_proj",
            params={"qkv": True},
            before="""
                from vllm_neuron.utils.weight_loader import fused_qkv_weight_loader, set_weight_loader


                class LlamaAttention(nn.Module):
                    def _setup_weight_loaders(self):
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


                class LlamaForCausalLM(nn.Module):
                    def load_weights(self, path):
                        mappings = {}
                        for layer_id in range(n):
                            prefix = f"model.layers.{layer_id}"
                            mappings[f"{prefix}.self_attn.qkv_proj_weight"] = [
                                f"{prefix}.self_attn.q_proj.weight",
                                f"{prefix}.self_attn.k_proj.weight",
                                f"{prefix}.self_attn.v_proj.weight",
                            ]
            """,
            after=QKV_EXAMPLE_AFTER,
        ),
        Example(
            title="Falcon-40B: query_key_value in a group per KV head (its query heads, a key, a value)",
            params={"qkv": True, "qkv_layout": "kv_groups"},
            before="""
                from vllm_neuron.utils.weight_loader import fused_qkv_weight_loader, set_weight_loader


                class LlamaAttention(nn.Module):
                    def _setup_weight_loaders(self):
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
            """,
            after=KV_GROUPS_EXAMPLE_AFTER,
        ),
        Example(
            title="gate and up share a local loader: each gets its own part, inside the same rank override",
            params={"gate_up": True},
            before="""
                from vllm_neuron.utils.weight_loader import set_weight_loader, sharding_weight_loader, with_rank_override


                class LlamaMLP(nn.Module):
                    def _setup_weight_loaders(self):
                        gate_up_loader = sharding_weight_loader(shard_dim=1, shard_size=i, num_shards=self.mlp_tp_size, is_storage_transposed=True)
                        down_loader = sharding_weight_loader(shard_dim=0, shard_size=i, num_shards=self.mlp_tp_size, is_storage_transposed=True)
                        gate_up_loader = with_rank_override(gate_up_loader, rank=self.mlp_tp_rank)
                        down_loader = with_rank_override(down_loader, rank=self.mlp_tp_rank)
                        set_weight_loader(self.gate_proj_weight, gate_up_loader)
                        set_weight_loader(self.up_proj_weight, gate_up_loader)
                        set_weight_loader(self.down_proj_weight, down_loader)

                    def forward(self, x, is_prefill):
                        return NF.mlp(x, self.gate_proj_weight, self.up_proj_weight, self.down_proj_weight)


                class LlamaForCausalLM(nn.Module):
                    def load_weights(self, checkpoint_path, device, cache_dir):
                        mappings = {}
                        for layer_id in range(n):
                            prefix = f"model.layers.{layer_id}"
                            mappings[f"{prefix}.mlp.gate_proj_weight"] = f"{prefix}.mlp.gate_proj.weight"
                            mappings[f"{prefix}.mlp.up_proj_weight"] = f"{prefix}.mlp.up_proj.weight"
                            for suffix in ("_cte", "_tkg"):
                                mappings[f"{prefix}.mlp.gate_proj_weight{suffix}"] = f"{prefix}.mlp.gate_proj.weight"
                                mappings[f"{prefix}.mlp.up_proj_weight{suffix}"] = f"{prefix}.mlp.up_proj.weight"
            """,
            after='''
                from vllm_neuron.utils.weight_loader import SafetensorsWeightLoader, set_weight_loader, sharding_weight_loader, with_rank_override


                class LlamaMLP(nn.Module):
                    def _setup_weight_loaders(self):
                        down_loader = sharding_weight_loader(shard_dim=0, shard_size=i, num_shards=self.mlp_tp_size, is_storage_transposed=True)
                        down_loader = with_rank_override(down_loader, rank=self.mlp_tp_rank)
                        set_weight_loader(
                            self.gate_proj_weight,
                            with_rank_override(
                                fused_part_loader(
                                    part=0,
                                    num_parts=2,
                                    shard_size=i,
                                    num_shards=self.mlp_tp_size,
                                    is_storage_transposed=True,
                                ),
                                rank=self.mlp_tp_rank,
                            ),
                        )
                        set_weight_loader(
                            self.up_proj_weight,
                            with_rank_override(
                                fused_part_loader(
                                    part=1,
                                    num_parts=2,
                                    shard_size=i,
                                    num_shards=self.mlp_tp_size,
                                    is_storage_transposed=True,
                                ),
                                rank=self.mlp_tp_rank,
                            ),
                        )
                        set_weight_loader(self.down_proj_weight, down_loader)

                    def forward(self, x, is_prefill):
                        return NF.mlp(x, self.gate_proj_weight, self.up_proj_weight, self.down_proj_weight)


                def fused_part_loader(part, num_parts, shard_size, num_shards, is_storage_transposed=False):
                    """Loader for this rank's shard of one part of a checkpoint tensor made of
                    num_parts equal blocks on its first dimension (Phi-3 gate_up_proj:
                    [gate | up]); a weight comes out transposed with is_storage_transposed."""

                    def transform(slices, rank):
                        if len(slices) != 1:
                            raise ValueError(f"fused_part_loader takes one fused tensor, got {len(slices)}")
                        rows = slices[0].get_shape()[0]
                        if rows % num_parts != 0:
                            raise ValueError(f"fused_part_loader: {rows} rows do not split into {num_parts} parts")
                        start = part * (rows // num_parts) + (rank % num_shards) * shard_size
                        shard = slices[0][start : start + shard_size]
                        return shard.T if is_storage_transposed else shard

                    return SafetensorsWeightLoader(transform)


                class LlamaForCausalLM(nn.Module):
                    def load_weights(self, checkpoint_path, device, cache_dir):
                        mappings = {}
                        for layer_id in range(n):
                            prefix = f"model.layers.{layer_id}"
                            mappings[f"{prefix}.mlp.gate_proj_weight"] = f"{prefix}.mlp.gate_up_proj.weight"
                            mappings[f"{prefix}.mlp.up_proj_weight"] = f"{prefix}.mlp.gate_up_proj.weight"
                            for suffix in ("_cte", "_tkg"):
                                mappings[f"{prefix}.mlp.gate_proj_weight{suffix}"] = f"{prefix}.mlp.gate_up_proj.weight"
                                mappings[f"{prefix}.mlp.up_proj_weight{suffix}"] = f"{prefix}.mlp.gate_up_proj.weight"
            ''',
        ),
        Example(
            title="a plain MLP has no gate to fuse",
            params={"gate_up": True},
            before="""
                class LlamaMLP(nn.Module):
                    def forward(self, x, is_prefill):
                        return NF.mlp(x, self.up_proj_weight, self.up_proj_weight, self.down_proj_weight, skip_gate=True)
            """,
            raises="gate_up needs a gated MLP",
        ),
    )

    @classmethod
    def params_for(cls, diffs, target, port: PortContext) -> FusedCheckpointParams:
        qkv = target.checkpoint.qkv
        layouts = {"fused_per_head": "per_head", "fused_grouped": "grouped", "fused_kv_groups": "kv_groups"}
        return FusedCheckpointParams(
            qkv=qkv in ("fused", "fused_per_head", "fused_grouped", "fused_kv_groups"),
            qkv_layout=layouts.get(qkv, "concatenated"),  # type: ignore[arg-type]
            qkv_groups=target.checkpoint.qkv_groups or 4,
            qkv_order=target.checkpoint.qkv_order or "qkv",
            gate_up=target.checkpoint.gate_up == "fused",
        )

    @classmethod
    def check_params(cls, params: FusedCheckpointParams) -> list[str]:
        problems = [] if params.qkv or params.gate_up else ["nothing to do: set qkv or gate_up"]
        if sorted(params.qkv_order) != ["k", "q", "v"]:
            problems.append(f"qkv_order: {params.qkv_order!r} is not an order of q, k and v")
        if params.qkv_groups < 1:
            problems.append(f"qkv_groups: {params.qkv_groups} groups")
        return problems

    def transform_module(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        edits: dict = {}
        helpers: list[tuple[str, str, str]] = []  # (function name, code, class it follows)
        renamed_keys: dict[str, str] = {}  # parameter attribute -> checkpoint module name
        if self.params.qkv:
            attention = self._qkv_edits(module, ctx, edits)
            if attention is not None:
                helpers.append((QKV_SPLIT, QKV_SPLIT_CODE, attention))
        if self.params.gate_up:
            self._refuse_per_expert_gate_up(module, ctx)
            mlp, attrs = self._gate_up_edits(module, ctx, edits)
            if mlp is not None:
                helpers.append((PART, PART_CODE, mlp))
            renamed_keys.update(attrs)
        self._mapping_edits(module, ctx, edits, renamed_keys)
        module = rewrite(module, edits)
        for name, code, after in helpers:
            module = add_function_after(module, name, code, after)
        if helpers:
            module = ensure_import_from(module, WEIGHT_LOADERS, "SafetensorsWeightLoader")
        return module

    # -- attention ---------------------------------------------------------------

    def _qkv_edits(self, module: cst.Module, ctx: FileContext, edits: dict) -> str | None:
        """Edits of the attention classes' fused QKV loaders; the class the
        split loader is written after (None: no attention class in this file)."""
        classes = classes_with_role(module, "attention")
        if not classes:
            if not any(class_role(name) == "attention" for name in ctx.port.package_classes):
                raise ctx.precondition(f"{self.ID}: no attention class in the package")
            return None
        target = None
        plain = [cls for cls in classes if not is_quantized(cls)]
        for cls in classes:
            if is_quantized(cls):
                edits.update(guard_edit(cls, GUARD_QKV, module))
                declare_guarded(cls, ctx, GUARD_QKV)
                continue
            loaders = LoaderEdits(module, ctx, cls)
            for key, sites in loaders.found.items():
                names = {dotted(s.base.func) for s in sites if s.base is not None}
                if QKV_SPLIT in names:
                    target = target or cls.name.value
                elif names & set(QKV_LOADERS) or ("qkv" in key and any(s.problem for s in sites)):
                    for site in loaders.require(key):
                        self._check_qkv_loader(site, cls, module, ctx)
                    loaders.replace_base(
                        key,
                        split_loader_edit(
                            module, self.params.qkv_layout, self.params.qkv_groups, self.params.qkv_order
                        ),
                    )
                    target = target or cls.name.value
            edits.update(loaders.edits())
        if target is None and plain:
            raise ctx.precondition(
                f"{self.ID}: no attention class attaching fused_qkv_weight_loader(...) to its QKV weight in this file"
            )
        return target

    def _check_qkv_loader(self, site, cls: cst.ClassDef, module: cst.Module, ctx: FileContext) -> None:
        base = site.base
        if dotted(base.func) not in QKV_LOADERS:
            raise ctx.precondition(
                f"{self.ID}: the loader of self.{site.key} is {dotted(base.func)} ({site.describe()}), expected "
                f"{' or '.join(QKV_LOADERS)}",
                base,
                module,
            )
        shard_dim = keyword_arg(base, "shard_dim")
        if shard_dim is not None and code_of(shard_dim.value) != "1":
            raise ctx.precondition(
                f"{self.ID}: the fused QKV weight of {cls.name.value} is sharded on dim "
                f"{code_of(shard_dim.value)}; fused-checkpoint handles shard_dim=1 ([hidden, q|k|v])",
                base,
                module,
            )
        unknown = [
            code_of(a).strip().rstrip(",")
            for a in base.args
            if a.keyword is None or a.keyword.value not in (*QKV_KWARGS, "shard_dim")
        ]
        if unknown:
            raise ctx.precondition(
                f"{self.ID}: the loader of self.{site.key} passes {', '.join(unknown)}, which {QKV_SPLIT} "
                "does not take (it reads keyword arguments: " + ", ".join(QKV_KWARGS) + ")",
                base,
                module,
            )

    # -- MLP ----------------------------------------------------------------------

    def _gate_up_edits(
        self, module: cst.Module, ctx: FileContext, edits: dict
    ) -> tuple[str | None, dict[str, str]]:
        """Edits of the MLP classes' gate and up loaders; the class the part
        loader is written after, and the parameters whose keys change."""
        mlps = mlp_classes(module, ctx)
        if not mlps:
            return None, {a: self.params.gate_up_name for a in self._mapped_gate_up(module, ctx)}
        target = None
        renamed: dict[str, str] = {}
        for mlp in mlps:
            if mlp.quantized:
                edits.update(guard_edit(mlp.cls, GUARD_GATE_UP, module))
                declare_guarded(mlp.cls, ctx, GUARD_GATE_UP)
                continue
            parts = self._parts(mlp, module, ctx)
            loaders = LoaderEdits(module, ctx, mlp.cls)
            for attr, part in parts.items():
                if not loaders.of(attr) and not attr.endswith("_weight"):
                    continue  # no bias
                for site in loaders.require(attr):
                    self._check_part_loader(site, module, ctx)
                if loaders.base_name(attr) != PART:
                    loaders.replace_base(attr, part_loader_edit(part))
                renamed[attr] = self.params.gate_up_name
            edits.update(loaders.edits())
            target = target or mlp.name
        return target, renamed

    def _refuse_per_expert_gate_up(self, module: cst.Module, ctx: FileContext) -> None:
        """A file that maps its experts' gate and up weights to per-expert keys
        (``mappings[...] = [f"...experts.{e}.gate_proj.weight" ...]``, the real
        vllm_neuron qwen3_moe) keeps them when only an ``NF.mlp`` is edited: with
        gate and up stored fused, the experts would not load; refused, naming it.
        A mapping that also takes the fused ``experts.gate_up_proj`` (as
        checkpoint-keys writes it) is left alone."""
        for node in subscript_assignments(module):
            value = code_of(node.value)
            if PER_EXPERT_GATE_UP.search(value) and not FUSED_EXPERTS.search(value):
                raise ctx.precondition(
                    f"{self.ID}: the experts map gate and up to per-expert keys "
                    f"({code_of(node.targets[0].target).strip()}), which this codemod does not change: "
                    "with gate and up stored fused they would not load",
                    node,
                    module,
                )

    def _parts(self, mlp, module: cst.Module, ctx: FileContext) -> dict[str, int]:
        """``attr -> part`` (0: gate, 1: up) of the weights and their biases."""
        parsed = [parse_mlp_call(module, ctx, call) for call in mlp.calls]
        pairs = {(p.gate, p.up) for p in parsed}
        if not all(p.gated and p.gate is not None for p in parsed):
            raise ctx.precondition(
                f"{self.ID}: gate_up needs a gated MLP (NF.mlp without skip_gate)", parsed[0].call, module
            )
        if len(pairs) != 1:
            raise ctx.precondition(
                f"{self.ID}: the NF.mlp calls of {mlp.name} use different gate/up weights",
                mlp.calls[0],
                module,
            )
        gate, up = pairs.pop()
        parts = {gate: 0, up: 1}
        for weight in list(parts):
            if weight.endswith("_weight"):
                parts[weight[: -len("_weight")] + "_bias"] = parts[weight]
        return parts  # type: ignore[return-value]

    def _check_part_loader(self, site, module: cst.Module, ctx: FileContext) -> None:
        name = dotted(site.base.func)
        if name == PART:
            return
        if name != "sharding_weight_loader":
            raise ctx.precondition(
                f"{self.ID}: the loader of self.{site.key} is {name} ({site.describe()}), expected sharding_weight_loader",
                site.base,
                module,
            )
        unknown = [
            code_of(a).strip().rstrip(",")
            for a in site.base.args
            if a.keyword is None or a.keyword.value not in (*PART_KWARGS, "shard_dim")
        ]
        if unknown:
            raise ctx.precondition(
                f"{self.ID}: the loader of self.{site.key} passes {', '.join(unknown)}, which {PART} does not take",
                site.base,
                module,
            )

    def _mapped_gate_up(self, module: cst.Module, ctx: FileContext) -> list[str]:
        """In a file that maps the MLP without defining it: the gate and up
        weights (and biases) among its MLP mapping keys, by their leading
        ``gate``/``up``; a precondition error when that does not tell."""
        weights = mlp_mapping_weights(module)
        if not weights:
            return []
        gates = [w for w in weights if w.startswith("gate")]
        ups = [w for w in weights if w.startswith("up")]
        if len(gates) != 1 or len(ups) != 1:
            raise ctx.precondition(
                f"{self.ID}: this file maps MLP weights ({', '.join(weights)}) without defining the MLP class; "
                "cannot tell its gate and up weights apart"
            )
        found = [gates[0], ups[0]]
        return found + [w[: -len("_weight")] + "_bias" for w in found]

    # -- load_weights ------------------------------------------------------------

    def _mapping_edits(
        self, module: cst.Module, ctx: FileContext, edits: dict, renamed: dict[str, str]
    ) -> None:
        entries = mapping_entries(module)
        for entry in entries:
            value = entry.value
            if (
                self.params.qkv
                and isinstance(value, (cst.List, cst.Tuple))
                and "qkv" in entry.key.rsplit(".", 1)[-1]
            ):
                self._qkv_entry_edit(entry, module, ctx, edits)
            param = entry_param(entry.key)
            if param in renamed:
                self._part_entry_edit(entry, param, renamed[param], module, ctx, edits)

    def _qkv_entry_edit(self, entry, module: cst.Module, ctx: FileContext, edits: dict) -> None:
        value = entry.value
        texts = [string_text(e.value) for e in value.elements]
        if len(texts) != 3 or any(t is None for t in texts):
            return
        segments = [t.split(".") for t in texts]  # type: ignore[union-attr]
        differing = [i for i in range(len(segments[0])) if len({tuple(s[i : i + 1]) for s in segments}) > 1]
        if len({len(s) for s in segments}) != 1 or len(differing) != 1:
            raise ctx.precondition(
                f"{self.ID}: the checkpoint keys of {entry.key} do not differ in exactly one segment",
                entry.statement,
                module,
            )
        old = segments[0][differing[0]]
        new_node = replace_segment(value.elements[0].value, old, self.params.qkv_name)
        edits[id(value)] = lambda updated, new_node=new_node: new_node

    def _part_entry_edit(
        self, entry, param: str, fused: str, module: cst.Module, ctx: FileContext, edits: dict
    ) -> None:
        value = entry.value
        stem = param.rsplit("_", 1)[0]  # gate_proj_weight -> gate_proj
        text = string_text(value)
        if text is None:
            raise ctx.precondition(
                f"{self.ID}: the checkpoint key of {entry.key} is not a string ({code_of(value).strip()})",
                entry.statement,
                module,
            )
        new_node = replace_segment(value, stem, fused)
        if new_node is None and f".{fused}." not in f".{text}.":
            raise ctx.precondition(
                f"{self.ID}: the checkpoint key of {entry.key} has no segment {stem!r} to replace",
                entry.statement,
                module,
            )
        if new_node is not None:
            edits[id(value)] = lambda updated, new_node=new_node: new_node.with_changes(
                lpar=updated.lpar, rpar=updated.rpar
            )
