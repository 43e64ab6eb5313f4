"""mlp-bias: biases on the dense MLP projections."""

from __future__ import annotations

import libcst as cst

from autoport_cst.transform import Codemod, Example, FileContext, NoParams, PortContext
from autoport_cst.transform.arguments import set_keyword
from autoport_cst.transform.cst_helpers import (
    dotted,
    ensure_import_from,
    keyword_arg,
    parse_expr,
    parse_statement,
    replace_string_suffix,
    rewrite,
)
from autoport_cst.transform.layers import (
    MLP_KEYWORDS,
    WEIGHT_LOADERS,
    bias_parameter,
    kwarg_code,
    loader_sites,
    map_value_strings,
    parameters,
    the_mlp,
)
from autoport_cst.transform.mappings import entry_statement, mapping_entries


class MlpBias(Codemod):
    """Give the dense MLP projections biases (up, gate when gated, and down).

    In the ``<Prefix>MLP`` class, for each weight passed to ``NF.mlp`` (named
    ``<x>_weight``):

    - ``__init__``: ``self.<x>_bias = nn.Parameter(torch.zeros(<last weight
      dim>, dtype=<same>))`` after the weight;
    - loaders: the up and gate biases are sharded on the intermediate
      dimension like their weights (``sharding_weight_loader(shard_dim=0,
      shard_size=<the weight's shard size>, num_shards=<the weight's shard
      count>)``); the down bias is loaded whole and divided by the shard
      count (``scaled_bias_loader(scale=<shard count>)``), because ``NF.mlp``
      adds it to each rank's partial output before the sum across ranks;
    - ``NF.mlp`` gets ``gate_b=``, ``up_b=``, ``down_b=`` as ``<bias>.unsqueeze(0)``
      (the kernel wants ``[1, N]`` biases);
    - ``load_weights``: a ``.<x>_bias`` entry after each ``.<x>_weight`` entry,
      its checkpoint key(s) ending in ``.bias`` instead of ``.weight``.

    Runs after ``mlp-kind`` (a plain MLP gets no gate bias). Preconditions:
    one ``<Prefix>MLP`` class with one ``NF.mlp`` call whose weights are
    ``nn.Parameter`` attributes named ``<x>_weight``, each with a
    ``sharding_weight_loader`` (directly or in a ``for`` loop), and a
    ``mappings[...<x>_weight]`` entry per weight.
    """

    ID = "mlp-bias"
    REALIZES = ("mlp.bias",)
    Params = NoParams
    AFTER = ("mlp-kind",)
    EXAMPLES = (
        Example(
            title="plain MLP with biases (Starcoder2, GPT-NeoX, Phi)",
            before="""
                from vllm_neuron.utils.weight_loader import set_weight_loader, sharding_weight_loader


                class LlamaMLP(nn.Module):
                    def __init__(self, config):
                        self.up_proj_weight = nn.Parameter(torch.empty(h, self.i_per_rank, dtype=self.dtype))
                        self.down_proj_weight = nn.Parameter(torch.empty(self.i_per_rank, h, dtype=self.dtype))
                        set_weight_loader(
                            self.up_proj_weight,
                            sharding_weight_loader(shard_dim=1, shard_size=self.i_per_rank, num_shards=self.world_size, is_storage_transposed=True),
                        )
                        set_weight_loader(
                            self.down_proj_weight,
                            sharding_weight_loader(shard_dim=0, shard_size=self.i_per_rank, num_shards=self.world_size, is_storage_transposed=True),
                        )

                    def forward(self, x, is_prefill):
                        return NF.mlp(x, self.up_proj_weight, self.up_proj_weight, self.down_proj_weight, skip_gate=True)


                class LlamaForCausalLM(nn.Module):
                    def load_weights(self, path):
                        mappings = {}
                        for layer_id in range(n):
                            prefix = f"model.layers.{layer_id}"
                            mappings[f"{prefix}.mlp.up_proj_weight"] = f"{prefix}.mlp.up_proj.weight"
                            mappings[f"{prefix}.mlp.down_proj_weight"] = f"{prefix}.mlp.down_proj.weight"
            """,
            after="""
                from vllm_neuron.utils.weight_loader import scaled_bias_loader, set_weight_loader, sharding_weight_loader


                class LlamaMLP(nn.Module):
                    def __init__(self, config):
                        self.up_proj_weight = nn.Parameter(torch.empty(h, self.i_per_rank, dtype=self.dtype))
                        self.up_proj_bias = nn.Parameter(torch.zeros(self.i_per_rank, dtype=self.dtype))
                        self.down_proj_weight = nn.Parameter(torch.empty(self.i_per_rank, h, dtype=self.dtype))
                        self.down_proj_bias = nn.Parameter(torch.zeros(h, dtype=self.dtype))
                        set_weight_loader(
                            self.up_proj_weight,
                            sharding_weight_loader(shard_dim=1, shard_size=self.i_per_rank, num_shards=self.world_size, is_storage_transposed=True),
                        )
                        set_weight_loader(
                            self.up_proj_bias,
                            sharding_weight_loader(shard_dim=0, shard_size=self.i_per_rank, num_shards=self.world_size),
                        )
                        set_weight_loader(
                            self.down_proj_weight,
                            sharding_weight_loader(shard_dim=0, shard_size=self.i_per_rank, num_shards=self.world_size, is_storage_transposed=True),
                        )
                        set_weight_loader(self.down_proj_bias, scaled_bias_loader(scale=self.world_size))

                    def forward(self, x, is_prefill):
                        return NF.mlp(x, self.up_proj_weight, self.up_proj_weight, self.down_proj_weight, skip_gate=True, up_b=self.up_proj_bias.unsqueeze(0), down_b=self.down_proj_bias.unsqueeze(0))


                class LlamaForCausalLM(nn.Module):
                    def load_weights(self, path):
                        mappings = {}
                        for layer_id in range(n):
                            prefix = f"model.layers.{layer_id}"
                            mappings[f"{prefix}.mlp.up_proj_weight"] = f"{prefix}.mlp.up_proj.weight"
                            mappings[f"{prefix}.mlp.up_proj_bias"] = f"{prefix}.mlp.up_proj.bias"
                            mappings[f"{prefix}.mlp.down_proj_weight"] = f"{prefix}.mlp.down_proj.weight"
                            mappings[f"{prefix}.mlp.down_proj_bias"] = f"{prefix}.mlp.down_proj.bias"
            """,
        ),
        Example(
            title="a weight without a sharding loader",
            before="""
                class LlamaMLP(nn.Module):
                    def __init__(self, config):
                        self.up_proj_weight = nn.Parameter(torch.empty(h, i))
                        self.down_proj_weight = nn.Parameter(torch.empty(i, h))

                    def forward(self, x, is_prefill):
                        return NF.mlp(x, self.up_proj_weight, self.up_proj_weight, self.down_proj_weight, skip_gate=True)
            """,
            raises="attaches no loader to self.up_proj_weight",
        ),
    )

    @classmethod
    def realizes(cls, diff) -> bool:
        return diff.path in cls.REALIZES and diff.target is True

    @classmethod
    def params_for(cls, diffs, target, port: PortContext) -> NoParams:
        return NoParams()

    def transform_module(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        mlp_cls, parsed = the_mlp(module, ctx, self.ID)
        name = mlp_cls.name.value
        roles = ([("gate", parsed.gate)] if parsed.gated else []) + [("up", parsed.up), ("down", parsed.down)]
        params = parameters(mlp_cls)
        sites = loader_sites(mlp_cls)
        edits: dict = {}
        after_weight: dict[int, list] = {}
        after_loader: dict[int, list] = {}
        arguments: list[tuple[str, str]] = []
        biases: list[tuple[str, str]] = []
        needs_scaled = False
        for role, weight in roles:
            if weight is None or not weight.endswith("_weight"):
                raise ctx.precondition(
                    f"{self.ID}: the {role} weight of NF.mlp in {name} must be a self.<x>_weight parameter",
                    parsed.call,
                    module,
                )
            bias = weight[: -len("_weight")] + "_bias"
            arguments.append((f"{role}_b", bias))
            biases.append((weight, bias))
            if bias in params:
                continue
            if weight not in params:
                raise ctx.precondition(f"{self.ID}: {name} has no self.{weight} = nn.Parameter(...)", mlp_cls, module)
            site = sites.get(weight)
            if site is None or site.loader is None:
                raise ctx.precondition(
                    f"{self.ID}: {name} attaches no loader to self.{weight} (set_weight_loader(self.{weight}, ...))",
                    mlp_cls,
                    module,
                )
            if dotted(site.loader.func) != "sharding_weight_loader":
                raise ctx.precondition(
                    f"{self.ID}: the loader of self.{weight} is {dotted(site.loader.func)}, expected "
                    "sharding_weight_loader (run mlp-bias before fused-checkpoint)",
                    site.statement,
                    module,
                )
            shards = kwarg_code(site.loader, "num_shards") or "1"
            after_weight.setdefault(id(params[weight]), []).append(bias_parameter(params[weight], bias, module))
            if role == "down":
                loader = parse_statement(f"set_weight_loader(self.{bias}, scaled_bias_loader(scale={shards}))", module)
                needs_scaled = True
            else:
                size = kwarg_code(site.loader, "shard_size")
                if size is None:
                    raise ctx.precondition(
                        f"{self.ID}: the loader of self.{weight} has no shard_size= argument", site.statement, module
                    )
                loader = parse_statement(
                    f"set_weight_loader(\n    self.{bias},\n    sharding_weight_loader(shard_dim=0, "
                    f"shard_size={size}, num_shards={shards}),\n)",
                    module,
                )
            after_loader.setdefault(id(site.statement), []).append(loader)
        for key, new in {**after_weight, **after_loader}.items():
            edits[key] = lambda updated, new=new: cst.FlattenSentinel([updated, *new])

        def edit_call(updated: cst.Call) -> cst.Call:
            for keyword, bias in arguments:
                arg = keyword_arg(updated, keyword)
                if arg is None or dotted(arg.value) == "None":
                    updated = set_keyword(updated, keyword, parse_expr(f"self.{bias}.unsqueeze(0)", module), order=MLP_KEYWORDS)
            return updated

        edits[id(parsed.call)] = edit_call
        edits.update(self._mapping_edits(module, biases, ctx))
        module = rewrite(module, edits)
        if needs_scaled:
            module = ensure_import_from(module, WEIGHT_LOADERS, "scaled_bias_loader")
        return module

    def _mapping_edits(self, module: cst.Module, biases, ctx: FileContext) -> dict:
        entries = mapping_entries(module)
        keys = {e.key for e in entries}
        edits = {}
        for weight, bias in biases:
            found = [e for e in entries if e.key.endswith("." + weight)]
            if not found:
                raise ctx.precondition(f"{self.ID}: load_weights has no mappings[...{weight}] entry")
            for entry in found:
                if entry.key[: -len(weight)] + bias in keys:
                    continue
                key = replace_string_suffix(entry.key_node, weight, bias)
                value = map_value_strings(entry.value, lambda s: replace_string_suffix(s, ".weight", ".bias"))
                if key is None or value is None:
                    raise ctx.precondition(
                        f"{self.ID}: cannot derive the bias key from the mapping of {entry.key} "
                        "(expected checkpoint keys ending in .weight)",
                        entry.statement,
                        module,
                    )
                new = entry_statement(entry, key, value)
                edits[id(entry.statement)] = lambda updated, new=new: cst.FlattenSentinel([updated, new])
        return edits
