"""fused-checkpoint: load Q/K/V and gate/up from fused checkpoint tensors."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import libcst as cst

from autoport_cst.transform import Codemod, Example, FileContext, PortContext
from autoport_cst.transform.arguments import set_keyword
from autoport_cst.transform.cst_helpers import (
    classes_with_role,
    code_of,
    dotted,
    ensure_import_from,
    keyword_arg,
    parse_expr,
    parse_statement,
    rewrite,
    string_text,
)
from autoport_cst.transform.layers import (
    WEIGHT_LOADERS,
    add_edit,
    loader_sites,
    loop_attrs,
    replace_segment,
    set_loader_statement,
    the_mlp,
)
from autoport_cst.transform.mappings import mapping_entries

QKV_LOADERS = ("fused_qkv_weight_loader", "fused_qkv_bias_loader")
QKV_SPLIT = "fused_qkv_split_loader"
PART = "fused_part_loader"
QKV_KWARGS = ("q_size", "kv_size", "num_shards", "num_kv_replicas", "is_storage_transposed")

QKV_SPLIT_CODE = f'''
def {QKV_SPLIT}(q_size, kv_size, num_shards, num_kv_replicas=1, is_storage_transposed=False, per_head=False, head_dim=None):
    """Loader for this rank's [q | k | v] slice of one checkpoint tensor that
    fuses Q, K and V on its first dimension.

    Concatenated layout (Phi-3 qkv_proj): every query row, then every key row, then
    every value row. Per-head layout (GPT-NeoX query_key_value, per_head=True):
    head by head, that head's query, key and value rows (head_dim each); it
    needs as many key/value heads as query heads. Each rank takes its query
    heads and the key/value heads it holds (ranks share a KV head when there
    are fewer KV heads than ranks). Weights come out transposed to
    [hidden, q | k | v] with is_storage_transposed; biases stay 1-D.
    """

    def transform(slices, rank):
        if len(slices) != 1:
            raise ValueError(f"{QKV_SPLIT} takes one fused tensor, got {{len(slices)}}")
        fused = slices[0]
        rows = fused.get_shape()[0]
        q_rank = rank % num_shards
        kv_rank = q_rank // num_kv_replicas
        if per_head:
            if kv_size != q_size or num_kv_replicas != 1:
                raise ValueError("a per-head fused QKV tensor needs as many KV heads as query heads")
            heads = q_size // head_dim
            block = fused[q_rank * 3 * q_size : (q_rank + 1) * 3 * q_size]
            block = block.reshape(heads, 3, head_dim, *block.shape[1:])
            parts = [block[:, index].reshape(q_size, *block.shape[3:]) for index in range(3)]
        else:
            q_total = q_size * num_shards
            kv_total = (rows - q_total) // 2
            k_start = q_total + kv_rank * kv_size
            v_start = q_total + kv_total + kv_rank * kv_size
            parts = [
                fused[q_rank * q_size : (q_rank + 1) * q_size],
                fused[k_start : k_start + kv_size],
                fused[v_start : v_start + kv_size],
            ]
        if is_storage_transposed:
            parts = [part.T for part in parts]
        return torch.cat(parts, dim=-1 if is_storage_transposed else 0)

    return SafetensorsWeightLoader(transform)
'''

PART_CODE = f'''
def {PART}(part, num_parts, shard_size, num_shards, is_storage_transposed=False):
    """Loader for this rank's shard of one part of a checkpoint tensor made of
    num_parts equal blocks on its first dimension (Phi-3 gate_up_proj:
    [gate | up]); a weight comes out transposed with is_storage_transposed."""

    def transform(slices, rank):
        if len(slices) != 1:
            raise ValueError(f"{PART} takes one fused tensor, got {{len(slices)}}")
        rows = slices[0].get_shape()[0]
        if rows % num_parts != 0:
            raise ValueError(f"{PART}: {{rows}} rows do not split into {{num_parts}} parts")
        start = part * (rows // num_parts) + (rank % num_shards) * shard_size
        shard = slices[0][start : start + shard_size]
        return shard.T if is_storage_transposed else shard

    return SafetensorsWeightLoader(transform)
'''


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


@dataclass(frozen=True)
class FusedCheckpointParams:
    qkv: bool = field(default=False, metadata={"doc": "Q, K and V come from one fused checkpoint tensor."})
    qkv_layout: Literal["concatenated", "per_head"] = field(
        default="concatenated",
        metadata={
            "doc": "concatenated: [all q | all k | all v] rows (Phi-3 qkv_proj); per_head: [q k v] rows per head "
            "(GPT-NeoX query_key_value; needs as many KV heads as query heads)."
        },
    )
    qkv_name: str = field(default="qkv_proj", metadata={"doc": "Checkpoint module name of the fused tensor."})
    gate_up: bool = field(default=False, metadata={"doc": "Gate and up come from one fused [gate | up] tensor."})
    gate_up_name: str = field(default="gate_up_proj", metadata={"doc": "Checkpoint module name of that tensor."})


class FusedCheckpoint(Codemod):
    """Load the fused QKV parameter and the gate and up parameters from fused checkpoint tensors.

    The reference fuses separate ``q_proj``/``k_proj``/``v_proj`` tensors on
    load. Checkpoints such as Phi-3 store one ``qkv_proj.weight`` (rows: all
    queries, then keys, then values) and one ``gate_up_proj.weight`` (rows:
    gate, then up); GPT-NeoX stores ``query_key_value`` with the rows grouped
    per head (``qkv_layout="per_head"``).

    With ``qkv``, in the attention class, the loaders built with
    ``fused_qkv_weight_loader`` / ``fused_qkv_bias_loader`` (same sizes, shard
    count, KV replication and transpose) become ``fused_qkv_split_loader``
    (added to the model file): each rank reads its query rows and the rows of
    the KV heads it holds from the one tensor. In ``load_weights`` a ``[q, k, v]``
    key list becomes the single fused key (the differing segment replaced by
    ``qkv_name``). With ``gate_up``, in the MLP class, the gate and up
    parameters' ``sharding_weight_loader`` (shared ``for`` loops are unrolled)
    become ``fused_part_loader(part=0 or 1, num_parts=2, ...)`` (added to the
    model file), for weights and biases alike, and their keys point at the
    ``gate_up_name`` tensor.

    Realizes ``checkpoint.qkv`` (``fused``: concatenated; ``fused_per_head``:
    ``qkv_layout="per_head"``) and ``checkpoint.gate_up = fused``.

    Runs after ``add-qkv-bias`` and ``mlp-bias`` (their bias loaders are
    rewritten too). Preconditions: the parameters to change have the expected
    loaders (a fused weight loader with ``shard_dim=1``); a gated MLP for
    ``gate_up``; key lists of three keys differing in one segment. Already
    converted loaders and keys are left alone.
    """

    ID = "fused-checkpoint"
    REALIZES = ("checkpoint.qkv", "checkpoint.gate_up")
    Params = FusedCheckpointParams
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
    def realizes(cls, diff) -> bool:
        return diff.path in cls.REALIZES and diff.target in ("fused", "fused_per_head")

    @classmethod
    def params_for(cls, diffs, target, port: PortContext) -> FusedCheckpointParams:
        qkv = target.checkpoint.qkv
        return FusedCheckpointParams(
            qkv=qkv in ("fused", "fused_per_head"),
            qkv_layout="per_head" if qkv == "fused_per_head" else "concatenated",
            gate_up=target.checkpoint.gate_up == "fused",
        )

    @classmethod
    def check_params(cls, params: FusedCheckpointParams) -> list[str]:
        return [] if params.qkv or params.gate_up else ["nothing to do: set qkv or gate_up"]

    def transform_module(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        edits: dict = {}
        helpers: list[tuple[str, str, str]] = []  # (function name, code, class it follows)
        renamed_keys: dict[str, str] = {}  # parameter attribute -> checkpoint module name
        if self.params.qkv:
            attention = self._qkv_edits(module, ctx, edits)
            helpers.append((QKV_SPLIT, QKV_SPLIT_CODE, attention))
        if self.params.gate_up:
            mlp, attrs = self._gate_up_edits(module, ctx, edits)
            helpers.append((PART, PART_CODE, mlp))
            renamed_keys.update(attrs)
        self._mapping_edits(module, ctx, edits, renamed_keys)
        module = rewrite(module, edits)
        for name, code, after in helpers:
            module = _add_function(module, name, code, after)
        if helpers:
            module = ensure_import_from(module, WEIGHT_LOADERS, "SafetensorsWeightLoader")
        return module

    # -- attention ---------------------------------------------------------------

    def _qkv_edits(self, module: cst.Module, ctx: FileContext, edits: dict) -> str:
        classes = classes_with_role(module, "attention")
        found = False
        for cls in classes:
            for attr, site in loader_sites(cls).items():
                name = dotted(site.loader.func) if site.loader is not None else None
                if name == QKV_SPLIT:
                    found = True
                elif name in QKV_LOADERS:
                    found = True
                    if site.in_loop:
                        raise ctx.precondition(
                            f"{self.ID}: the fused QKV loader of {attr} is in a loop", site.statement, module
                        )
                    shard_dim = keyword_arg(site.loader, "shard_dim")
                    if shard_dim is not None and code_of(shard_dim.value) != "1":
                        raise ctx.precondition(
                            f"{self.ID}: the fused QKV weight of {cls.name.value} is sharded on dim "
                            f"{code_of(shard_dim.value)}; fused-checkpoint handles shard_dim=1 ([hidden, q|k|v])",
                            site.statement,
                            module,
                        )
                    edits[id(site.loader)] = self._split_loader_edit(module)
            if found:
                return cls.name.value
        raise ctx.precondition(
            f"{self.ID}: no attention class attaching fused_qkv_weight_loader(...) to its QKV weight in this file"
        )

    def _split_loader_edit(self, module: cst.Module):
        per_head = self.params.qkv_layout == "per_head"

        def edit(updated: cst.Call) -> cst.Call:
            kept = [a for a in updated.args if a.keyword is not None and a.keyword.value in QKV_KWARGS]
            if kept and kept[-1] is not updated.args[-1]:
                kept[-1] = kept[-1].with_changes(comma=updated.args[-1].comma)
            call = updated.with_changes(func=cst.Name(QKV_SPLIT), args=kept)
            if per_head:
                call = set_keyword(call, "per_head", parse_expr("True", module))
                call = set_keyword(call, "head_dim", parse_expr("self.head_dim", module))
            return call

        return edit

    # -- MLP ----------------------------------------------------------------------

    def _gate_up_edits(self, module: cst.Module, ctx: FileContext, edits: dict) -> tuple[str, dict[str, str]]:
        mlp_cls, parsed = the_mlp(module, ctx, self.ID)
        if not parsed.gated or parsed.gate is None:
            raise ctx.precondition(f"{self.ID}: gate_up needs a gated MLP (NF.mlp without skip_gate)", parsed.call, module)
        parts = {parsed.gate: 0, parsed.up: 1}
        for weight in list(parts):
            if weight.endswith("_weight"):
                parts[weight[: -len("_weight")] + "_bias"] = parts[weight]
        sites = {a: s for a, s in loader_sites(mlp_cls).items() if a in parts}
        for weight in (parsed.gate, parsed.up):
            if weight not in sites:
                raise ctx.precondition(
                    f"{self.ID}: {mlp_cls.name.value} attaches no loader to self.{weight}", mlp_cls, module
                )
        loops: dict[int, cst.For] = {}
        for attr, site in sites.items():
            if site.loader is None:
                raise ctx.precondition(f"{self.ID}: the loader of self.{attr} is not a call", site.statement, module)
            name = dotted(site.loader.func)
            if name == PART:
                continue
            if name != "sharding_weight_loader":
                raise ctx.precondition(
                    f"{self.ID}: the loader of self.{attr} is {name}, expected sharding_weight_loader",
                    site.statement,
                    module,
                )
            if site.in_loop:
                loops[id(site.statement)] = site.statement  # type: ignore[assignment]
            else:
                edits[id(site.loader)] = _part_loader_edit(parts[attr])
        for loop in loops.values():
            attrs = loop_attrs(loop)
            inner = loop.body.body[0].body[0].value  # set_weight_loader(w, <loader>)
            statements = []
            for attr in attrs:
                loader = inner.args[1].value
                if attr in parts:
                    loader = _part_loader_edit(parts[attr])(loader)
                statements.append(set_loader_statement(attr, code_of(loader), module))
            statements[0] = statements[0].with_changes(leading_lines=loop.leading_lines)
            add_edit(edits, id(loop), lambda updated, new=statements: cst.FlattenSentinel(new))
        return mlp_cls.name.value, {a: self.params.gate_up_name for a in parts}

    # -- load_weights ------------------------------------------------------------

    def _mapping_edits(self, module: cst.Module, ctx: FileContext, edits: dict, renamed: dict[str, str]) -> None:
        entries = mapping_entries(module)
        qkv_lists = 0
        for entry in entries:
            value = entry.value
            if self.params.qkv and isinstance(value, (cst.List, cst.Tuple)) and "qkv" in entry.key.rsplit(".", 1)[-1]:
                texts = [string_text(e.value) for e in value.elements]
                if len(texts) != 3 or any(t is None for t in texts):
                    continue
                segments = [t.split(".") for t in texts]  # type: ignore[union-attr]
                differing = [i for i in range(len(segments[0])) if len({tuple(s[i:i + 1]) for s in segments}) > 1]
                if len({len(s) for s in segments}) != 1 or len(differing) != 1:
                    raise ctx.precondition(
                        f"{self.ID}: the checkpoint keys of {entry.key} do not differ in exactly one segment",
                        entry.statement,
                        module,
                    )
                old = segments[0][differing[0]]
                new_node = replace_segment(value.elements[0].value, old, self.params.qkv_name)
                edits[id(value)] = lambda updated, new_node=new_node: new_node
                qkv_lists += 1
            leaf = entry.key.rsplit(".", 1)[-1]
            if leaf in renamed:
                stem = leaf.rsplit("_", 1)[0]  # gate_proj_weight -> gate_proj
                fused = renamed[leaf]
                text = string_text(value)
                if text is None:
                    continue
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


def _part_loader_edit(part: int):
    def edit(updated: cst.Call) -> cst.Call:
        args = [a for a in updated.args if not (a.keyword is not None and a.keyword.value == "shard_dim")]
        if args and updated.args[-1] not in args:
            args[-1] = args[-1].with_changes(comma=updated.args[-1].comma)
        first_comma = args[0].comma if args else cst.MaybeSentinel.DEFAULT
        new = [
            cst.Arg(keyword=cst.Name("part"), value=cst.Integer(str(part)),
                    equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")), comma=first_comma),
            cst.Arg(keyword=cst.Name("num_parts"), value=cst.Integer("2"),
                    equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")), comma=first_comma),
        ]
        return updated.with_changes(func=cst.Name(PART), args=[*new, *args])

    return edit


def _add_function(module: cst.Module, name: str, code: str, after_class: str) -> cst.Module:
    if any(isinstance(s, cst.FunctionDef) and s.name.value == name for s in module.body):
        return module
    helper = parse_statement(code.strip("\n"), module).with_changes(
        leading_lines=[cst.EmptyLine(indent=False), cst.EmptyLine(indent=False)]
    )
    body = list(module.body)
    index = next(i for i, s in enumerate(body) if isinstance(s, cst.ClassDef) and s.name.value == after_class)
    body.insert(index + 1, helper)
    return module.with_changes(body=body)
