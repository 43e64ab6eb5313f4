"""mlp-kind: a gated MLP becomes a plain (non-gated) one."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import libcst as cst

from autoport_cst.spec.pitfalls import Pitfall
from autoport_cst.transform import Codemod, Example, FileContext, PortContext, locate
from autoport_cst.transform.anatomy.classes import parameters
from autoport_cst.transform.anatomy.mappings import mapping_entries
from autoport_cst.transform.anatomy.mlp import MLP_KEYWORDS, mlp_classes, mlp_mapping_weights, parse_mlp_call
from autoport_cst.transform.cst.snippets import parse_expr
from autoport_cst.transform.cst.vocabulary import code_of, keyword_arg, positional_args, walk
from autoport_cst.transform.edit.arguments import set_keyword
from autoport_cst.transform.edit.guards import declare_guarded, guard_edit
from autoport_cst.transform.edit.loaders import LoaderEdits, with_emptied_blocks
from autoport_cst.transform.edit.tree import add_edit, removal_edits, rewrite
from autoport_cst.transform.realizes import Realizes, to

GUARD = "mlp-kind: a plain (non-gated) MLP is not implemented for this quantized MLP"


@dataclass(frozen=True)
class MlpKindParams:
    kind: Literal["plain"] = field(
        default="plain",
        metadata={"doc": "plain: act(x @ up + up_b) @ down + down_b (the gate projection is removed)."},
    )


class MlpKind(Codemod):
    """Turn the gated dense MLP into a plain one: ``act(x @ up) @ down``.

    In every ``<Prefix>MLP`` class: the gate weight (the second positional
    argument of ``NF.mlp``) is deleted with its loader attachment (taken out
    of a ``for weight in (...)`` loop, which is unrolled when one parameter
    is left; a local loader the up weight shares stays); the ``NF.mlp``
    calls pass the up weight in the gate position (the kernel reads the
    intermediate size from it and ignores it with ``skip_gate``) and get
    ``skip_gate=True``. In ``load_weights`` every mapping entry of the gate
    weight is deleted, its copies for variants (``<gate>{suffix}``: the FP8
    ``_cte``/``_tkg``/``_plain`` buffers) included, and a loop they leave
    empty; a file that maps the MLP without defining it loses its gate
    entries too (the one ``...mlp.gate*`` weight). A quantized MLP (its kernel
    call passes ``quantization_type=``) is guarded: its ``__init__`` raises
    ``NotImplementedError``. The up and down parameters keep their
    names; checkpoints that call them ``c_fc``/``c_proj``, ``fc1``/``fc2`` or
    ``dense_h_to_4h``/``dense_4h_to_h`` are mapped with ``checkpoint-keys``.

    Runs before ``mlp-bias`` (which then adds no gate bias) and before
    ``fused-checkpoint``.

    Preconditions: ``NF.mlp(hidden, self.<gate>, self.<up>, self.<down>,
    ...)`` calls, one gate weight per class; the gate weight is an
    ``nn.Parameter`` of that class, with a loader, and used nowhere else (a
    remaining use is reported with its position). Only gated -> plain is
    supported: a plain MLP has no gate weights to load.
    """

    ID = "mlp-kind"
    REALIZES = Realizes({"mlp.kind": to("plain")})
    Params = MlpKindParams
    PITFALLS = (
        Pitfall(
            200,
            lambda spec, facts: spec.mlp.kind == "plain",
            "non-gated MLP: NF.mlp(skip_gate=True) with the up weight as gate placeholder",
        ),
    )
    EXAMPLES = (
        Example(
            title="gated SiLU MLP to a plain MLP",
            before="""
                class LlamaMLP(nn.Module):
                    def __init__(self, config):
                        self.gate_proj_weight = nn.Parameter(torch.empty(h, i, dtype=dtype))
                        self.up_proj_weight = nn.Parameter(torch.empty(h, i, dtype=dtype))
                        self.down_proj_weight = nn.Parameter(torch.empty(i, h, dtype=dtype))
                        for weight in (self.gate_proj_weight, self.up_proj_weight):
                            set_weight_loader(weight, sharding_weight_loader(shard_dim=1, shard_size=i, num_shards=n))
                        set_weight_loader(self.down_proj_weight, sharding_weight_loader(shard_dim=0, shard_size=i, num_shards=n))

                    def forward(self, x, is_prefill):
                        return NF.mlp(
                            x,
                            self.gate_proj_weight,
                            self.up_proj_weight,
                            self.down_proj_weight,
                        )


                class LlamaForCausalLM(nn.Module):
                    def load_weights(self, path):
                        mappings = {}
                        for layer_id in range(n):
                            prefix = f"model.layers.{layer_id}"
                            mappings[f"{prefix}.mlp.gate_proj_weight"] = f"{prefix}.mlp.gate_proj.weight"
                            mappings[f"{prefix}.mlp.up_proj_weight"] = f"{prefix}.mlp.up_proj.weight"
            """,
            after="""
                class LlamaMLP(nn.Module):
                    def __init__(self, config):
                        self.up_proj_weight = nn.Parameter(torch.empty(h, i, dtype=dtype))
                        self.down_proj_weight = nn.Parameter(torch.empty(i, h, dtype=dtype))
                        set_weight_loader(
                            self.up_proj_weight,
                            sharding_weight_loader(shard_dim=1, shard_size=i, num_shards=n),
                        )
                        set_weight_loader(self.down_proj_weight, sharding_weight_loader(shard_dim=0, shard_size=i, num_shards=n))

                    def forward(self, x, is_prefill):
                        return NF.mlp(
                            x,
                            self.up_proj_weight,
                            self.up_proj_weight,
                            self.down_proj_weight,
                            skip_gate=True,
                        )


                class LlamaForCausalLM(nn.Module):
                    def load_weights(self, path):
                        mappings = {}
                        for layer_id in range(n):
                            prefix = f"model.layers.{layer_id}"
                            mappings[f"{prefix}.mlp.up_proj_weight"] = f"{prefix}.mlp.up_proj.weight"
            """,
        ),
        Example(
            title="a gate loader in a local the up weight shares; the FP8 copies of its mapping go too",
            before="""
                class LlamaMLP(nn.Module):
                    def __init__(self, config):
                        self.gate_proj_weight = nn.Parameter(torch.empty(h, i, dtype=dtype))
                        self.up_proj_weight = nn.Parameter(torch.empty(h, i, dtype=dtype))
                        self.down_proj_weight = nn.Parameter(torch.empty(i, h, dtype=dtype))
                        self._setup_weight_loaders()

                    def _setup_weight_loaders(self):
                        gate_up_loader = sharding_weight_loader(shard_dim=1, shard_size=i, num_shards=self.mlp_tp_size)
                        down_loader = sharding_weight_loader(shard_dim=0, shard_size=i, num_shards=self.mlp_tp_size)
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
                            # <-- MODEL-SPECIFIC: dense MLP weight names
                            mappings[f"{prefix}.mlp.gate_proj_weight"] = f"{prefix}.mlp.gate_proj.weight"
                            mappings[f"{prefix}.mlp.up_proj_weight"] = f"{prefix}.mlp.up_proj.weight"
                            # FP8 copies (parameters of the quantized classes)
                            for suffix in ("_cte", "_tkg"):
                                mappings[f"{prefix}.mlp.gate_proj_weight{suffix}"] = f"{prefix}.mlp.gate_proj.weight"
                                mappings[f"{prefix}.mlp.up_proj_weight{suffix}"] = f"{prefix}.mlp.up_proj.weight"
                            for suffix in ("_plain",):
                                mappings[f"{prefix}.mlp.gate_proj_weight{suffix}"] = f"{prefix}.mlp.gate_proj.weight"
            """,
            after="""
                class LlamaMLP(nn.Module):
                    def __init__(self, config):
                        self.up_proj_weight = nn.Parameter(torch.empty(h, i, dtype=dtype))
                        self.down_proj_weight = nn.Parameter(torch.empty(i, h, dtype=dtype))
                        self._setup_weight_loaders()

                    def _setup_weight_loaders(self):
                        gate_up_loader = sharding_weight_loader(shard_dim=1, shard_size=i, num_shards=self.mlp_tp_size)
                        down_loader = sharding_weight_loader(shard_dim=0, shard_size=i, num_shards=self.mlp_tp_size)
                        gate_up_loader = with_rank_override(gate_up_loader, rank=self.mlp_tp_rank)
                        down_loader = with_rank_override(down_loader, rank=self.mlp_tp_rank)
                        set_weight_loader(self.up_proj_weight, gate_up_loader)
                        set_weight_loader(self.down_proj_weight, down_loader)

                    def forward(self, x, is_prefill):
                        return NF.mlp(x, self.up_proj_weight, self.up_proj_weight, self.down_proj_weight, skip_gate=True)


                class LlamaForCausalLM(nn.Module):
                    def load_weights(self, checkpoint_path, device, cache_dir):
                        mappings = {}
                        for layer_id in range(n):
                            prefix = f"model.layers.{layer_id}"
                            # <-- MODEL-SPECIFIC: dense MLP weight names
                            mappings[f"{prefix}.mlp.up_proj_weight"] = f"{prefix}.mlp.up_proj.weight"
                            # FP8 copies (parameters of the quantized classes)
                            for suffix in ("_cte", "_tkg"):
                                mappings[f"{prefix}.mlp.up_proj_weight{suffix}"] = f"{prefix}.mlp.up_proj.weight"
            """,
        ),
        Example(
            title="the gate weight is used elsewhere",
            before="""
                class LlamaMLP(nn.Module):
                    def __init__(self, config):
                        self.gate_proj_weight = nn.Parameter(torch.empty(h, i))
                        set_weight_loader(self.gate_proj_weight, loader)

                    def forward(self, x, is_prefill):
                        y = x @ self.gate_proj_weight
                        return NF.mlp(x, self.gate_proj_weight, self.up_proj_weight, self.down_proj_weight)
            """,
            raises="still used",
        ),
    )

    @classmethod
    def params_for(cls, diffs, target, port: PortContext) -> MlpKindParams:
        return MlpKindParams()

    def transform_module(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        edits: dict = {}
        gates: list[str] = []
        handled: set[int] = set()
        mlps = mlp_classes(module, ctx)
        for mlp in mlps:
            if mlp.quantized:
                edits.update(guard_edit(mlp.cls, GUARD, module))
                declare_guarded(mlp.cls, ctx, GUARD)
                handled.add(id(mlp.cls))
                continue
            gate = self._class_edits(mlp, module, ctx, edits, handled)
            if gate is not None and gate not in gates:
                gates.append(gate)
        if not mlps:
            candidates = [w for w in mlp_mapping_weights(module) if w.startswith("gate")]
            gates = candidates if len(candidates) == 1 else []
        entries = [e.statement for e in mapping_entries(module) if any(_is_entry_of(e.key, g) for g in gates)]
        doomed = with_emptied_blocks(module, entries)
        for key, fn in removal_edits(module, doomed).items():
            add_edit(edits, key, fn)
        handled.update(id(stmt) for stmt in [*entries, *doomed])
        for gate in gates:
            self._check_no_other_use(module, gate, handled, ctx)
        return rewrite(module, edits)

    def _class_edits(
        self, mlp, module: cst.Module, ctx: FileContext, edits: dict, handled: set[int]
    ) -> str | None:
        """Remove the gate of one MLP class; returns its weight attribute
        (None when the class is plain already)."""
        name = mlp.name
        parsed = [parse_mlp_call(module, ctx, call) for call in mlp.calls]
        if not any(p.gated for p in parsed):
            return None
        gates = {p.gate for p in parsed if p.gated}
        if len(gates) != 1 or None in gates or not all(p.gated for p in parsed):
            raise ctx.precondition(
                f"{self.ID}: the NF.mlp calls of {name} do not all pass one self.<gate> weight",
                mlp.calls[0],
                module,
            )
        gate = gates.pop()
        for p in parsed:
            gate_bias = keyword_arg(p.call, "gate_b")
            if gate_bias is not None and code_of(gate_bias.value) != "None":
                raise ctx.precondition(
                    f"{self.ID}: NF.mlp in {name} has a gate bias (gate_b=...); remove the gate first "
                    "(mlp-kind runs before mlp-bias)",
                    p.call,
                    module,
                )
        params = parameters(mlp.cls)
        if gate not in params:
            raise ctx.precondition(
                f"{self.ID}: {name} has no self.{gate} = nn.Parameter(...)", mlp.cls, module
            )
        loaders = LoaderEdits(module, ctx, mlp.cls)
        loaders.remove(gate)
        loaders.doom(params[gate])
        handled.add(id(params[gate]))
        handled.update(id(site.statement) for site in loaders.of(gate))
        edits.update(loaders.edits())
        for p in parsed:
            edits[id(p.call)] = self._call_edit(p, module)
            handled.add(id(p.call))
        return gate

    @staticmethod
    def _call_edit(parsed, module: cst.Module):
        up_arg = positional_args(parsed.call)[2].value

        def edit_call(updated: cst.Call) -> cst.Call:
            gate_arg = positional_args(updated)[1]
            args = [a.with_changes(value=up_arg) if a is gate_arg else a for a in updated.args]
            return set_keyword(
                updated.with_changes(args=args), "skip_gate", parse_expr("True", module), order=MLP_KEYWORDS
            )

        return edit_call

    def _check_no_other_use(self, module: cst.Module, attr: str, handled: set[int], ctx: FileContext) -> None:
        skipped: set[int] = set()
        for node in walk(module):
            if id(node) in handled:
                skipped.update(id(n) for n in walk(node))
            if id(node) in skipped:
                continue
            if isinstance(node, cst.Attribute) and node.attr.value == attr:
                line, column = locate(module, node)
                raise ctx.precondition(
                    f"{self.ID}: the gate weight {attr} is still used at line {line}, column {column}; "
                    "rewrite that use before removing the gate",
                    node,
                    module,
                )


def _is_entry_of(key: str, param: str) -> bool:
    """A mapping key of ``param``: ``...<param>``, or a copy for a variant of
    it, ``...<param>{suffix}`` (the FP8 ``_cte``/``_tkg``/``_plain`` buffers)."""
    leaf = key.rsplit(".", 1)[-1]
    if leaf == param:
        return True
    return leaf.startswith(param + "{") and leaf.endswith("}") and leaf.count("{") == 1
