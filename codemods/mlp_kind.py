"""mlp-kind: a gated MLP becomes a plain (non-gated) one."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import libcst as cst

from autoport_cst.transform import Codemod, Example, FileContext, PortContext, locate
from autoport_cst.transform.arguments import set_keyword
from autoport_cst.transform.cst_helpers import (
    code_of,
    keyword_arg,
    parse_expr,
    positional_args,
    rewrite,
    self_attr,
    walk,
)
from autoport_cst.transform.layers import (
    MLP_KEYWORDS,
    add_edit,
    loader_sites,
    loop_attrs,
    parameters,
    removal_edits,
    set_loader_statement,
    the_mlp,
)
from autoport_cst.transform.mappings import mapping_entries


@dataclass(frozen=True)
class MlpKindParams:
    kind: Literal["plain"] = field(
        default="plain",
        metadata={"doc": "plain: act(x @ up + up_b) @ down + down_b (the gate projection is removed)."},
    )


class MlpKind(Codemod):
    """Turn the gated dense MLP into a plain one: ``act(x @ up) @ down``.

    In the ``<Prefix>MLP`` class: the gate weight (the second positional
    argument of ``NF.mlp``) is deleted with its loader (taken out of a
    ``for weight in (...)`` loop, which is unrolled when one parameter is
    left); the ``NF.mlp`` call passes the up weight in the gate position (the
    kernel reads the intermediate size from it and ignores it with
    ``skip_gate``) and gets ``skip_gate=True``. In ``load_weights`` the gate
    weight's mapping entry is deleted. The up and down parameters keep their
    names; checkpoints that call them ``c_fc``/``c_proj``, ``fc1``/``fc2`` or
    ``dense_h_to_4h``/``dense_4h_to_h`` are mapped with ``checkpoint-keys``.

    Runs before ``mlp-bias`` (which then adds no gate bias) and before
    ``fused-checkpoint``.

    Preconditions: one ``<Prefix>MLP`` class with one ``NF.mlp(hidden,
    self.<gate>, self.<up>, self.<down>, ...)`` call; the gate weight is an
    ``nn.Parameter`` of that class, with a loader, and used nowhere else (a
    remaining use is reported with its position). Only gated -> plain is
    supported: a plain MLP has no gate weights to load.
    """

    ID = "mlp-kind"
    REALIZES = ("mlp.kind",)
    Params = MlpKindParams
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
    def realizes(cls, diff) -> bool:
        return diff.path in cls.REALIZES and diff.target == "plain"

    @classmethod
    def params_for(cls, diffs, target, port: PortContext) -> MlpKindParams:
        return MlpKindParams()

    def transform_module(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        mlp_cls, parsed = the_mlp(module, ctx, self.ID)
        if not parsed.gated:
            return module
        gate = parsed.gate
        name = mlp_cls.name.value
        if gate is None:
            raise ctx.precondition(
                f"{self.ID}: the gate argument of NF.mlp in {name} is not a self.<weight>", parsed.call, module
            )
        gate_bias = keyword_arg(parsed.call, "gate_b")
        if gate_bias is not None and code_of(gate_bias.value) != "None":
            raise ctx.precondition(
                f"{self.ID}: NF.mlp in {name} has a gate bias (gate_b=...); remove the gate first "
                "(mlp-kind runs before mlp-bias)",
                parsed.call,
                module,
            )
        params = parameters(mlp_cls)
        if gate not in params:
            raise ctx.precondition(
                f"{self.ID}: {name} has no self.{gate} = nn.Parameter(...)", mlp_cls, module
            )
        sites = loader_sites(mlp_cls)
        site = sites.get(gate)
        if site is None:
            raise ctx.precondition(
                f"{self.ID}: {name} attaches no loader to self.{gate} (set_weight_loader(self.{gate}, ...))",
                mlp_cls,
                module,
            )
        doomed = [params[gate]] + ([] if site.in_loop else [site.statement])
        edits: dict = removal_edits(mlp_cls, doomed)
        handled = {id(params[gate]), id(parsed.call), id(site.statement)}
        if site.in_loop:
            loop = site.statement
            rest = [a for a in loop_attrs(loop) if a != gate]  # type: ignore[arg-type]
            add_edit(edits, id(loop), self._loop_edit(loop, gate, rest, module))
        up_arg = positional_args(parsed.call)[2].value

        def edit_call(updated: cst.Call) -> cst.Call:
            args = list(updated.args)
            gate_arg = positional_args(updated)[1]
            args = [a.with_changes(value=up_arg) if a is gate_arg else a for a in args]
            return set_keyword(updated.with_changes(args=args), "skip_gate", parse_expr("True", module), order=MLP_KEYWORDS)

        edits[id(parsed.call)] = edit_call
        for entry in mapping_entries(module):
            if entry.key.endswith("." + gate) or entry.key == gate:
                edits[id(entry.statement)] = lambda updated: cst.RemoveFromParent()
                handled.add(id(entry.statement))
        self._check_no_other_use(module, gate, handled, ctx)
        return rewrite(module, edits)

    def _loop_edit(self, loop: cst.For, gate: str, rest: list[str], module: cst.Module):
        if not rest:
            return lambda updated: cst.RemoveFromParent()
        if len(rest) == 1:
            inner = loop.body.body[0].body[0].value  # set_weight_loader(w, <loader>)
            stmt = set_loader_statement(rest[0], code_of(inner.args[1].value), module)
            stmt = stmt.with_changes(leading_lines=loop.leading_lines)
            return lambda updated: stmt

        def keep(updated: cst.For) -> cst.For:
            elements = [e for e in updated.iter.elements if self_attr(e.value) != gate]
            elements[-1] = elements[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
            return updated.with_changes(iter=updated.iter.with_changes(elements=elements))

        return keep

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
