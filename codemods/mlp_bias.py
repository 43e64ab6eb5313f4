"""mlp-bias: biases on the dense MLP projections."""

from __future__ import annotations

import libcst as cst

from autoport_cst.spec.pitfalls import Pitfall
from autoport_cst.transform import Codemod, Example, FileContext, NoParams, PortContext
from autoport_cst.transform.anatomy.classes import parameters
from autoport_cst.transform.anatomy.mappings import entry_statement, mapping_entries
from autoport_cst.transform.anatomy.mlp import MLP_KEYWORDS, mlp_classes, mlp_mapping_weights, parse_mlp_call
from autoport_cst.transform.cst.snippets import parse_expr, parse_statement
from autoport_cst.transform.cst.vocabulary import dotted, keyword_arg
from autoport_cst.transform.edit.arguments import set_keyword
from autoport_cst.transform.edit.guards import declare_guarded, guard_edit
from autoport_cst.transform.edit.imports import ensure_import_from
from autoport_cst.transform.edit.loaders import LoaderEdits, attach_statement
from autoport_cst.transform.edit.mappings import map_value_strings
from autoport_cst.transform.edit.parameters import WEIGHT_LOADERS, bias_parameter, kwarg_code
from autoport_cst.transform.edit.tree import replace_string_suffix, rewrite
from autoport_cst.transform.realizes import Realizes, to

GUARD = "mlp-bias: biases on the MLP projections are not implemented for this quantized MLP"


class MlpBias(Codemod):
    """Give the dense MLP projections biases (up, gate when gated, and down).

    In every ``<Prefix>MLP`` class, for each weight passed to ``NF.mlp``
    (named ``<x>_weight``):

    - ``__init__``: ``self.<x>_bias = nn.Parameter(torch.zeros(<last weight
      dim>, dtype=<same>))`` after the weight;
    - loaders: the up and gate biases are sharded on the intermediate
      dimension like their weights (``sharding_weight_loader(shard_dim=0,
      shard_size=<the weight's shard size>, num_shards=<the weight's shard
      count>)``), inside the same rank wrappers (``with_rank_override(...,
      rank=self.mlp_tp_rank)`` with MLP data parallelism); the down bias is
      loaded whole and divided by the shard count (``scaled_bias_loader(scale=
      <shard count>)``), because ``NF.mlp`` adds it to each rank's partial
      output before the sum across ranks. A weight's loader is found where it
      is built: written in ``set_weight_loader(self.<x>_weight, ...)``, in a
      ``for`` loop over weights, or in a local variable (shared, rebound
      through wrappers); each bias loader is attached right after its
      weight's;
    - ``NF.mlp`` gets ``gate_b=``, ``up_b=``, ``down_b=`` as ``<bias>.unsqueeze(0)``
      (the kernel wants ``[1, N]`` biases);
    - ``load_weights``: a ``.<x>_bias`` entry after each ``.<x>_weight`` entry,
      its checkpoint key(s) ending in ``.bias`` instead of ``.weight``; also in
      a file that maps the MLP without defining it (an embedding model over
      the same backbone: the ``...mlp.<x>_weight`` keys).

    A quantized MLP (its kernel call passes ``quantization_type=``: the FP8
    classes) is guarded: its ``__init__`` raises ``NotImplementedError``.

    Runs after ``mlp-kind`` (a plain MLP gets no gate bias). Preconditions:
    ``NF.mlp`` calls whose weights are ``nn.Parameter`` attributes named
    ``<x>_weight``, each with a ``sharding_weight_loader`` this codemod can
    read (a wrapper other than ``with_rank_override``, or a loader attached
    by a helper the class hands ``self`` to, is refused by name), and a
    ``mappings[...<x>_weight]`` entry per weight.
    """

    ID = "mlp-bias"
    REALIZES = Realizes({"mlp.bias": to(True)})
    Params = NoParams
    PITFALLS = (
        Pitfall(
            210,
            lambda spec, facts: spec.mlp.bias,
            "MLP biases: down_proj bias is added before the TP sum, load it divided by TP",
        ),
    )
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
            title="loaders in locals shared by gate and up, rebound through a rank override (MLP data parallelism)",
            before="""
                from vllm_neuron.utils.weight_loader import set_weight_loader, sharding_weight_loader, with_rank_override


                class LlamaMLP(nn.Module):
                    def __init__(self, config):
                        self.gate_proj_weight = nn.Parameter(torch.empty(h, self.i_per_rank, dtype=dtype))
                        self.up_proj_weight = nn.Parameter(torch.empty(h, self.i_per_rank, dtype=dtype))
                        self.down_proj_weight = nn.Parameter(torch.empty(self.i_per_rank, h, dtype=dtype))
                        self._setup_weight_loaders()

                    def _setup_weight_loaders(self):
                        gate_up_loader = sharding_weight_loader(shard_dim=1, shard_size=self.i_per_rank, num_shards=self.mlp_tp_size)
                        down_loader = sharding_weight_loader(shard_dim=0, shard_size=self.i_per_rank, num_shards=self.mlp_tp_size)
                        gate_up_loader = with_rank_override(gate_up_loader, rank=self.mlp_tp_rank)
                        down_loader = with_rank_override(down_loader, rank=self.mlp_tp_rank)
                        set_weight_loader(self.gate_proj_weight, gate_up_loader)
                        set_weight_loader(self.up_proj_weight, gate_up_loader)
                        set_weight_loader(self.down_proj_weight, down_loader)

                    def forward(self, x, is_prefill):
                        output = NF.mlp(x, self.gate_proj_weight, self.up_proj_weight, self.down_proj_weight)
                        if not is_prefill:
                            self.mlp_tp_group.all_reduce(output)
                        return output


                class LlamaForCausalLM(nn.Module):
                    def load_weights(self, checkpoint_path, device, cache_dir):
                        mappings = {}
                        for layer_id in range(n):
                            prefix = f"model.layers.{layer_id}"
                            mappings[f"{prefix}.mlp.gate_proj_weight"] = f"{prefix}.mlp.gate_proj.weight"
                            mappings[f"{prefix}.mlp.up_proj_weight"] = f"{prefix}.mlp.up_proj.weight"
                            mappings[f"{prefix}.mlp.down_proj_weight"] = f"{prefix}.mlp.down_proj.weight"
                            for suffix in ("_cte", "_tkg"):
                                mappings[f"{prefix}.mlp.gate_proj_weight{suffix}"] = f"{prefix}.mlp.gate_proj.weight"
            """,
            after="""
                from vllm_neuron.utils.weight_loader import scaled_bias_loader, set_weight_loader, sharding_weight_loader, with_rank_override


                class LlamaMLP(nn.Module):
                    def __init__(self, config):
                        self.gate_proj_weight = nn.Parameter(torch.empty(h, self.i_per_rank, dtype=dtype))
                        self.gate_proj_bias = nn.Parameter(torch.zeros(self.i_per_rank, dtype=dtype))
                        self.up_proj_weight = nn.Parameter(torch.empty(h, self.i_per_rank, dtype=dtype))
                        self.up_proj_bias = nn.Parameter(torch.zeros(self.i_per_rank, dtype=dtype))
                        self.down_proj_weight = nn.Parameter(torch.empty(self.i_per_rank, h, dtype=dtype))
                        self.down_proj_bias = nn.Parameter(torch.zeros(h, dtype=dtype))
                        self._setup_weight_loaders()

                    def _setup_weight_loaders(self):
                        gate_up_loader = sharding_weight_loader(shard_dim=1, shard_size=self.i_per_rank, num_shards=self.mlp_tp_size)
                        down_loader = sharding_weight_loader(shard_dim=0, shard_size=self.i_per_rank, num_shards=self.mlp_tp_size)
                        gate_up_loader = with_rank_override(gate_up_loader, rank=self.mlp_tp_rank)
                        down_loader = with_rank_override(down_loader, rank=self.mlp_tp_rank)
                        set_weight_loader(self.gate_proj_weight, gate_up_loader)
                        set_weight_loader(
                            self.gate_proj_bias,
                            with_rank_override(
                                sharding_weight_loader(shard_dim=0, shard_size=self.i_per_rank, num_shards=self.mlp_tp_size),
                                rank=self.mlp_tp_rank,
                            ),
                        )
                        set_weight_loader(self.up_proj_weight, gate_up_loader)
                        set_weight_loader(
                            self.up_proj_bias,
                            with_rank_override(
                                sharding_weight_loader(shard_dim=0, shard_size=self.i_per_rank, num_shards=self.mlp_tp_size),
                                rank=self.mlp_tp_rank,
                            ),
                        )
                        set_weight_loader(self.down_proj_weight, down_loader)
                        set_weight_loader(self.down_proj_bias, scaled_bias_loader(scale=self.mlp_tp_size))

                    def forward(self, x, is_prefill):
                        output = NF.mlp(x, self.gate_proj_weight, self.up_proj_weight, self.down_proj_weight, gate_b=self.gate_proj_bias.unsqueeze(0), up_b=self.up_proj_bias.unsqueeze(0), down_b=self.down_proj_bias.unsqueeze(0))
                        if not is_prefill:
                            self.mlp_tp_group.all_reduce(output)
                        return output


                class LlamaForCausalLM(nn.Module):
                    def load_weights(self, checkpoint_path, device, cache_dir):
                        mappings = {}
                        for layer_id in range(n):
                            prefix = f"model.layers.{layer_id}"
                            mappings[f"{prefix}.mlp.gate_proj_weight"] = f"{prefix}.mlp.gate_proj.weight"
                            mappings[f"{prefix}.mlp.gate_proj_bias"] = f"{prefix}.mlp.gate_proj.bias"
                            mappings[f"{prefix}.mlp.up_proj_weight"] = f"{prefix}.mlp.up_proj.weight"
                            mappings[f"{prefix}.mlp.up_proj_bias"] = f"{prefix}.mlp.up_proj.bias"
                            mappings[f"{prefix}.mlp.down_proj_weight"] = f"{prefix}.mlp.down_proj.weight"
                            mappings[f"{prefix}.mlp.down_proj_bias"] = f"{prefix}.mlp.down_proj.bias"
                            for suffix in ("_cte", "_tkg"):
                                mappings[f"{prefix}.mlp.gate_proj_weight{suffix}"] = f"{prefix}.mlp.gate_proj.weight"
            """,
        ),
        Example(
            title="a quantized MLP is guarded: it raises when built",
            before="""
                class LlamaMLP(nn.Module):
                    def __init__(self, config):
                        super().__init__()
                        self.gate_proj_weight = nn.Parameter(torch.empty(h, i, dtype=torch.float8_e4m3fn))
                        self.up_proj_weight = nn.Parameter(torch.empty(h, i, dtype=torch.float8_e4m3fn))
                        self.down_proj_weight = nn.Parameter(torch.empty(i, h, dtype=torch.float8_e4m3fn))

                    def forward(self, x, is_prefill):
                        return NF.mlp(
                            x,
                            self.gate_proj_weight,
                            self.up_proj_weight,
                            self.down_proj_weight,
                            quantization_type=QuantizationType.STATIC,
                        )
            """,
            after="""
                class LlamaMLP(nn.Module):
                    def __init__(self, config):
                        super().__init__()
                        raise NotImplementedError("mlp-bias: biases on the MLP projections are not implemented for this quantized MLP")
                        self.gate_proj_weight = nn.Parameter(torch.empty(h, i, dtype=torch.float8_e4m3fn))
                        self.up_proj_weight = nn.Parameter(torch.empty(h, i, dtype=torch.float8_e4m3fn))
                        self.down_proj_weight = nn.Parameter(torch.empty(i, h, dtype=torch.float8_e4m3fn))

                    def forward(self, x, is_prefill):
                        return NF.mlp(
                            x,
                            self.gate_proj_weight,
                            self.up_proj_weight,
                            self.down_proj_weight,
                            quantization_type=QuantizationType.STATIC,
                        )
            """,
        ),
        Example(
            title="a file that maps the MLP without defining it (an embedding model over the same backbone)",
            package_classes=("LlamaMLP",),
            before="""
                class LlamaForEmbedding(nn.Module):
                    def load_weights(self, checkpoint_path, device, cache_dir):
                        mappings = {}
                        for layer_id in range(n):
                            prefix = f"model.layers.{layer_id}"
                            mappings[f"{prefix}.self_attn.o_proj_weight"] = f"{prefix}.self_attn.o_proj.weight"
                            mappings[f"{prefix}.mlp.up_proj_weight"] = f"{prefix}.mlp.up_proj.weight"
                            mappings[f"{prefix}.mlp.down_proj_weight"] = f"{prefix}.mlp.down_proj.weight"
            """,
            after="""
                class LlamaForEmbedding(nn.Module):
                    def load_weights(self, checkpoint_path, device, cache_dir):
                        mappings = {}
                        for layer_id in range(n):
                            prefix = f"model.layers.{layer_id}"
                            mappings[f"{prefix}.self_attn.o_proj_weight"] = f"{prefix}.self_attn.o_proj.weight"
                            mappings[f"{prefix}.mlp.up_proj_weight"] = f"{prefix}.mlp.up_proj.weight"
                            mappings[f"{prefix}.mlp.up_proj_bias"] = f"{prefix}.mlp.up_proj.bias"
                            mappings[f"{prefix}.mlp.down_proj_weight"] = f"{prefix}.mlp.down_proj.weight"
                            mappings[f"{prefix}.mlp.down_proj_bias"] = f"{prefix}.mlp.down_proj.bias"
            """,
        ),
        Example(
            title="loaders attached out of sight",
            before="""
                class LlamaMLP(nn.Module):
                    def __init__(self, config):
                        self.gate_proj_weight = nn.Parameter(torch.empty(h, i))
                        self.up_proj_weight = nn.Parameter(torch.empty(h, i))
                        self.down_proj_weight = nn.Parameter(torch.empty(i, h))
                        attach_mlp_loaders(self, shard_size=i)

                    def forward(self, x, is_prefill):
                        return NF.mlp(x, self.gate_proj_weight, self.up_proj_weight, self.down_proj_weight)
            """,
            raises="it hands self to attach_mlp_loaders(...)",
        ),
        Example(
            title="a wrapper that does more than choose a rank",
            before="""
                class LlamaMLP(nn.Module):
                    def __init__(self, config):
                        self.up_proj_weight = nn.Parameter(torch.empty(h, i))
                        self.down_proj_weight = nn.Parameter(torch.empty(i, h))
                        up_loader = sharding_weight_loader(shard_dim=1, shard_size=i, num_shards=n)
                        up_loader = wrap_with_downscale(up_loader)
                        set_weight_loader(self.up_proj_weight, up_loader)
                        set_weight_loader(self.down_proj_weight, sharding_weight_loader(shard_dim=0, shard_size=i, num_shards=n))

                    def forward(self, x, is_prefill):
                        return NF.mlp(x, self.up_proj_weight, self.up_proj_weight, self.down_proj_weight, skip_gate=True)
            """,
            raises="is wrapped in wrap_with_downscale(...)",
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
    def params_for(cls, diffs, target, port: PortContext) -> NoParams:
        return NoParams()

    def transform_module(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        edits: dict = {}
        weights: list[str] = []
        needs_scaled = False
        mlps = mlp_classes(module, ctx)
        for mlp in mlps:
            if mlp.quantized:
                edits.update(guard_edit(mlp.cls, GUARD, module))
                declare_guarded(mlp.cls, ctx, GUARD)
                continue
            class_weights, scaled = self._class_edits(mlp, module, ctx, edits)
            weights += [w for w in class_weights if w not in weights]
            needs_scaled = needs_scaled or scaled
        if not mlps:
            weights = mlp_mapping_weights(module)
        edits.update(self._mapping_edits(module, weights, ctx, required=bool(mlps)))
        module = rewrite(module, edits)
        if needs_scaled:
            module = ensure_import_from(module, WEIGHT_LOADERS, "scaled_bias_loader")
        return module

    def _class_edits(self, mlp, module: cst.Module, ctx: FileContext, edits: dict) -> tuple[list[str], bool]:
        """Bias parameters, loaders and kernel arguments of one MLP class;
        returns its weights and whether a scaled bias loader was added."""
        name = mlp.name
        roles: list[tuple[str, str]] = []
        for call in mlp.calls:
            parsed = parse_mlp_call(module, ctx, call)
            for role, weight in ([("gate", parsed.gate)] if parsed.gated else []) + [
                ("up", parsed.up),
                ("down", parsed.down),
            ]:
                if weight is None or not weight.endswith("_weight"):
                    raise ctx.precondition(
                        f"{self.ID}: the {role} weight of NF.mlp in {name} must be a self.<x>_weight parameter",
                        call,
                        module,
                    )
                if (role, weight) not in roles:
                    roles.append((role, weight))
        params = parameters(mlp.cls)
        loaders = LoaderEdits(module, ctx, mlp.cls)
        after_weight: dict[int, list] = {}
        scaled = False
        for role, weight in roles:
            bias = _bias_of(weight)
            if bias in params:
                continue
            if weight not in params:
                raise ctx.precondition(
                    f"{self.ID}: {name} has no self.{weight} = nn.Parameter(...)", mlp.cls, module
                )
            after_weight.setdefault(id(params[weight]), []).append(
                bias_parameter(params[weight], bias, module)
            )
            for site in loaders.require(weight):
                loaders.add_after(site, [self._bias_loader(role, site, bias, loaders, module, ctx)])
                scaled = scaled or role == "down"
        for key, new in after_weight.items():
            edits[key] = lambda updated, new=new: cst.FlattenSentinel([updated, *new])
        edits.update(loaders.edits())
        arguments = [(f"{role}_b", _bias_of(weight)) for role, weight in roles]

        def edit_call(updated: cst.Call) -> cst.Call:
            for keyword, bias in arguments:
                arg = keyword_arg(updated, keyword)
                if arg is None or dotted(arg.value) == "None":
                    updated = set_keyword(
                        updated, keyword, parse_expr(f"self.{bias}.unsqueeze(0)", module), order=MLP_KEYWORDS
                    )
            return updated

        for call in mlp.calls:
            edits[id(call)] = edit_call
        return [weight for _, weight in roles], scaled

    def _bias_loader(
        self, role: str, site, bias: str, loaders: LoaderEdits, module: cst.Module, ctx: FileContext
    ) -> cst.BaseStatement:
        """The loader of ``bias`` from its weight's loader ``site``: sharded
        like the weight's intermediate dimension (with the same rank
        wrappers), or for the down bias, whole and divided by the number of
        shards summed after the kernel."""
        name = dotted(site.base.func)
        if name != "sharding_weight_loader":
            raise ctx.precondition(
                f"{self.ID}: the loader of self.{site.key} is {name} ({site.describe()}), expected "
                "sharding_weight_loader (run mlp-bias before fused-checkpoint)",
                site.base,
                module,
            )
        shards = kwarg_code(site.base, "num_shards") or "1"
        if role == "down":
            loaders.sibling_loader(site, "")  # the weight's wrappers only choose ranks
            return parse_statement(
                f"set_weight_loader(self.{bias}, scaled_bias_loader(scale={shards}))", module
            )
        size = kwarg_code(site.base, "shard_size")
        if size is None:
            raise ctx.precondition(
                f"{self.ID}: the loader of self.{site.key} has no shard_size= argument ({site.describe()})",
                site.base,
                module,
            )
        base = f"sharding_weight_loader(shard_dim=0, shard_size={size}, num_shards={shards})"
        return attach_statement(bias, loaders.sibling_loader(site, base), module)

    def _mapping_edits(
        self, module: cst.Module, weights: list[str], ctx: FileContext, required: bool
    ) -> dict:
        entries = mapping_entries(module)
        keys = {e.key for e in entries}
        edits = {}
        for weight in weights:
            bias = _bias_of(weight)
            found = [e for e in entries if e.key.endswith("." + weight)]
            if not found and required:
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


def _bias_of(weight: str) -> str:
    return weight[: -len("_weight")] + "_bias"
