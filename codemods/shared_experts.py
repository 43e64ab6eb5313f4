"""shared-experts: an always-on shared expert beside the routed ones, optionally gated."""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from autoport_cst.spec.pitfalls import Pitfall
from autoport_cst.transform import Codemod, Example, FileContext, PortContext
from autoport_cst.transform.anatomy import experts as anatomy_experts
from autoport_cst.transform.anatomy.classes import attr_of_role
from autoport_cst.transform.anatomy.mappings import entry_statement, mapping_entries
from autoport_cst.transform.cst.snippets import parse_expr, parse_statement, parse_statements
from autoport_cst.transform.cst.vocabulary import (
    code_of,
    dotted,
    is_call,
    keyword_arg,
    self_attr,
    simple_assign,
    statements,
    string_text,
    walk,
)
from autoport_cst.transform.edit import moe as moe_edits
from autoport_cst.transform.edit import shared_expert_code as code
from autoport_cst.transform.edit.config_fields import add_config_fields
from autoport_cst.transform.edit.functions import add_functions
from autoport_cst.transform.edit.imports import ensure_import_from
from autoport_cst.transform.edit.shared_expert_code import GATE, METHOD, WEIGHTS
from autoport_cst.transform.edit.tree import (
    followed_by,
    insert_many_after,
    preceded_by,
    replace_string_suffix,
    replaced_by,
    rewrite,
    with_comment,
)
from autoport_cst.transform.realizes import Change, Realizes, to

WEIGHT_LOADERS = "vllm_neuron.utils.weight_loader"


@dataclass(frozen=True)
class SharedExpertsParams:
    gate: bool = field(
        default=True,
        metadata={"doc": "A sigmoid gate (a [1, H] linear) scales the shared expert's output per token."},
    )
    count: int = field(
        default=1,
        metadata={
            "doc": "Shared experts of the architecture: the default of n_shared_experts in a config "
            "file that has no alias table (a config spelling it otherwise still gets this count)."
        },
    )


CONFIG_FIELDS = [
    ("n_shared_experts: int | None = None", ""),
    ("shared_expert_intermediate_size: int | None = None", ""),
]
CONFIG_ALIASES = {
    "n_shared_experts": (
        "n_shared_experts",
        "num_shared_experts",
        "moe_num_shared_experts",
        "num_shared_expert",
    ),
    "shared_expert_intermediate_size": ("shared_expert_intermediate_size", "shared_intermediate_size"),
}


class SharedExperts(Codemod):
    """Add an always-on shared expert to the MoE, optionally scaled by a sigmoid gate.

    Qwen2-MoE adds ``sigmoid(x W_g) * shared_expert(x)`` to the routed
    experts' output; DeepSeek-style models (Dots1, GLM-4-MoE, ERNIE-4.5-MoE,
    Hunyuan) add ``shared_experts(x)`` without a gate. ``x`` is the
    normalized input of the MoE. The shared expert's width is read from the
    config at run time by ``_shared_expert_width(config)`` (added to the
    model file): ``shared_expert_intermediate_size`` when the config has it,
    else ``moe_intermediate_size`` times ``n_shared_experts`` (one when the
    config does not say).

    In the experts class (``<Prefix>Experts``):

    - ``__init__``: the shared expert's SiLU-gated MLP weights
      ``shared_gate_proj_weight`` / ``shared_up_proj_weight`` ``[H, Is/tp]``
      and ``shared_down_proj_weight`` ``[Is/tp, H]`` (intermediate sharded
      over TP, like a dense MLP) after the routed experts' ``down_proj_weight``,
      and with ``gate`` the replicated ``shared_expert_gate_weight`` ``[H, 1]``;
    - ``_setup_weight_loaders``: sharding loaders for them (transposed from
      the checkpoint's ``[out, in]``);
    - a method ``_shared_expert(hidden_states)``: ``NF.mlp`` over the shared
      weights, times the sigmoid gate; its output is a partial sum over TP
      ranks, like the routed experts';
    - prefill: right after the routed experts' output is computed (the
      statement calling the blockwise method or ``NF.moe_cte``), the shared
      expert's output on the same normalized tokens is added, before the
      reduce-scatter;
    - decode: before the all-reduce, the shared expert's output on the
      normalized decode tokens (``self.<norm>(<input>)``, the experts class's
      own norm) is added.

    In ``load_weights`` the mapping gains the four (or three) entries next to
    the routed experts' ``down_proj_weight`` entry: the shared expert's
    ``{gate,up,down}_proj.weight`` under the MoE block, found in the
    checkpoint's tensor names by ``_shared_expert_key(names, block, tensor)``
    (added to the model file; checkpoints call the module ``shared_expert``,
    ``shared_experts`` or ``shared_mlp``), and
    ``<MoE block>.shared_expert_gate.weight``. In config.py the config
    dataclass gains ``shared_expert_intermediate_size`` and
    ``n_shared_experts``, with the config keys that hold them in
    ``_ALIASES``.

    Preconditions: an experts class calling ``NF.router`` with
    ``self.down_proj_weight``, ``self.hidden_size``, ``self.dtype``,
    ``self.world_size``, a ``_setup_weight_loaders`` method, its own norm
    module, a ``forward_prefill`` computing the routed output, a
    ``forward_decode`` with an all-reduce, the router's mapping entry and a
    ``names`` variable (the checkpoint's tensor names) in ``load_weights``.
    """

    ID = "shared-experts"
    REALIZES = Realizes({"moe.shared_experts": Change(count=True), "moe.shared_expert_gate": to(True)})
    Params = SharedExpertsParams
    PITFALLS = (
        Pitfall(
            320,
            lambda spec, facts: spec.moe is not None and spec.moe.shared_experts,
            lambda spec, facts: (
                "shared experts run on every token"
                + (" behind a sigmoid gate" if spec.moe and spec.moe.shared_expert_gate else "")
            ),
        ),
    )
    FILES = ("model", "config")
    EXAMPLES = (
        Example(
            title="Qwen2-MoE: one shared expert with a sigmoid gate",
            params={"gate": True},
            before="""
                from vllm_neuron.utils.weight_loader import set_weight_loader


                class Qwen3MoeExperts(nn.Module):
                    def __init__(self, config):
                        self.dtype = config.torch_dtype
                        self.hidden_size = config.hidden_size
                        self.world_size = self.tp_group.world_size
                        self.post_attention_layernorm = Qwen3MoeRMSNorm(config.hidden_size, config.rms_norm_eps, self.dtype)
                        self.router_weight = nn.Parameter(torch.empty(self.num_experts, self.hidden_size, dtype=torch.float32))
                        self.down_proj_weight = nn.Parameter(torch.empty(self.num_experts, self.size, self.hidden_size, dtype=self.dtype))

                    def _setup_weight_loaders(self):
                        set_weight_loader(self.down_proj_weight, expert_down_loader(self.size))

                    def _route(self, hidden_states):
                        return NF.router(hidden_states, router_weights=self.router_weight.T, top_k=2)

                    def forward_prefill(self, hidden_states, positions):
                        hidden_states = self.post_attention_layernorm(hidden_states)
                        output = self._experts_blockwise(hidden_states, self._route(hidden_states))
                        if self.world_size > 1:
                            output = self.tp_group.reduce_scatter(output, dim=0)
                        return output

                    def forward_decode(self, hidden_states):
                        output = self._run_moe_block_tkg(hidden_states)
                        if self.world_size > 1:
                            output = self.tp_group.all_reduce(output)
                        return output


                class Qwen3MoeForCausalLM(nn.Module):
                    def load_weights(self, path):
                        names = set(checkpoint.get_tensor_names())
                        for layer_id in range(2):
                            prefix = f"model.layers.{layer_id}"
                            mappings[f"{prefix}.mlp.experts.router_weight"] = f"{moe.router}.weight"
                            mappings[f"{prefix}.mlp.experts.down_proj_weight"] = moe.down
            """,
            after='''
                from vllm_neuron.utils.weight_loader import set_weight_loader, sharding_weight_loader


                def _shared_expert_key(names, block: str, tensor: str) -> str:
                    """Checkpoint key of ``tensor`` (``gate_proj.weight``...) of the shared
                    expert of MoE block ``block``, which checkpoints name ``shared_expert``,
                    ``shared_experts`` or ``shared_mlp``."""
                    for name in ("shared_expert", "shared_experts", "shared_mlp"):
                        if f"{block}.{name}.{tensor}" in names:
                            return f"{block}.{name}.{tensor}"
                    raise KeyError(
                        f"no shared expert in the checkpoint for {block} (looked for {block}.shared_expert.{tensor}, "
                        f"{block}.shared_experts.{tensor}, {block}.shared_mlp.{tensor})"
                    )


                def _shared_expert_width(config) -> int:
                    """Intermediate size of the always-on shared expert: the config's
                    ``shared_expert_intermediate_size`` when it has one (Qwen2-MoE), else the
                    expert intermediate size times the number of shared experts
                    (``n_shared_experts``; one when the config does not say)."""
                    if config.shared_expert_intermediate_size:
                        return config.shared_expert_intermediate_size
                    return config.moe_intermediate_size * (config.n_shared_experts or 1)


                class Qwen3MoeExperts(nn.Module):
                    def __init__(self, config):
                        self.dtype = config.torch_dtype
                        self.hidden_size = config.hidden_size
                        self.world_size = self.tp_group.world_size
                        self.post_attention_layernorm = Qwen3MoeRMSNorm(config.hidden_size, config.rms_norm_eps, self.dtype)
                        self.router_weight = nn.Parameter(torch.empty(self.num_experts, self.hidden_size, dtype=torch.float32))
                        self.down_proj_weight = nn.Parameter(torch.empty(self.num_experts, self.size, self.hidden_size, dtype=self.dtype))
                        # <-- MODEL-SPECIFIC: always-on shared expert (SiLU-gated MLP), intermediate sharded over TP
                        self.shared_intermediate_size_per_rank = _shared_expert_width(config) // self.world_size
                        self.shared_gate_proj_weight = nn.Parameter(
                            torch.empty(self.hidden_size, self.shared_intermediate_size_per_rank, dtype=self.dtype)
                        )
                        self.shared_up_proj_weight = nn.Parameter(
                            torch.empty(self.hidden_size, self.shared_intermediate_size_per_rank, dtype=self.dtype)
                        )
                        self.shared_down_proj_weight = nn.Parameter(
                            torch.empty(self.shared_intermediate_size_per_rank, self.hidden_size, dtype=self.dtype)
                        )
                        # <-- MODEL-SPECIFIC: a sigmoid gate (float32, like the router) scales the shared expert's output per token
                        self.shared_expert_gate_weight = nn.Parameter(torch.empty(self.hidden_size, 1, dtype=torch.float32))

                    def _setup_weight_loaders(self):
                        set_weight_loader(self.down_proj_weight, expert_down_loader(self.size))
                        # >>> PARALLELISM: the shared expert's intermediate dimension is sharded like a dense MLP's <<<
                        for weight in (self.shared_gate_proj_weight, self.shared_up_proj_weight):
                            set_weight_loader(
                                weight,
                                sharding_weight_loader(
                                    shard_dim=1,
                                    shard_size=self.shared_intermediate_size_per_rank,
                                    num_shards=self.world_size,
                                    is_storage_transposed=True,
                                ),
                            )
                        set_weight_loader(
                            self.shared_down_proj_weight,
                            sharding_weight_loader(
                                shard_dim=0,
                                shard_size=self.shared_intermediate_size_per_rank,
                                num_shards=self.world_size,
                                is_storage_transposed=True,
                            ),
                        )
                        set_weight_loader(
                            self.shared_expert_gate_weight,
                            sharding_weight_loader(shard_dim=1, shard_size=1, num_shards=1, is_storage_transposed=True),
                        )

                    def _shared_expert(self, hidden_states):
                        """The always-on shared expert on normalized hidden states [T, H]; partial sums over TP."""
                        output = NF.mlp(
                            hidden_states,
                            self.shared_gate_proj_weight,
                            self.shared_up_proj_weight,
                            self.shared_down_proj_weight,
                        )
                        gate = torch.sigmoid(hidden_states.to(torch.float32) @ self.shared_expert_gate_weight.to(torch.float32))
                        output = (output.to(torch.float32) * gate).to(output.dtype)
                        return output

                    def _route(self, hidden_states):
                        return NF.router(hidden_states, router_weights=self.router_weight.T, top_k=2)

                    def forward_prefill(self, hidden_states, positions):
                        hidden_states = self.post_attention_layernorm(hidden_states)
                        output = self._experts_blockwise(hidden_states, self._route(hidden_states))
                        output = output + self._shared_expert(hidden_states)
                        if self.world_size > 1:
                            output = self.tp_group.reduce_scatter(output, dim=0)
                        return output

                    def forward_decode(self, hidden_states):
                        output = self._run_moe_block_tkg(hidden_states)
                        output = output + self._shared_expert(self.post_attention_layernorm(hidden_states))
                        if self.world_size > 1:
                            output = self.tp_group.all_reduce(output)
                        return output


                class Qwen3MoeForCausalLM(nn.Module):
                    def load_weights(self, path):
                        names = set(checkpoint.get_tensor_names())
                        for layer_id in range(2):
                            prefix = f"model.layers.{layer_id}"
                            mappings[f"{prefix}.mlp.experts.router_weight"] = f"{moe.router}.weight"
                            mappings[f"{prefix}.mlp.experts.down_proj_weight"] = moe.down
                            mappings[f"{prefix}.mlp.experts.shared_gate_proj_weight"] = _shared_expert_key(names, moe.module, "gate_proj.weight")
                            mappings[f"{prefix}.mlp.experts.shared_up_proj_weight"] = _shared_expert_key(names, moe.module, "up_proj.weight")
                            mappings[f"{prefix}.mlp.experts.shared_down_proj_weight"] = _shared_expert_key(names, moe.module, "down_proj.weight")
                            mappings[f"{prefix}.mlp.experts.shared_expert_gate_weight"] = f"{moe.module}.shared_expert_gate.weight"
            ''',
        ),
        Example(
            title="config: the shared expert's width or count, under the keys configs use",
            role="config",
            path="config.py",
            params={"gate": False},
            before="""
                _ALIASES = {
                    "moe_intermediate_size": ("moe_intermediate_size", "intermediate_size"),
                    "num_experts": ("num_experts", "n_routed_experts"),
                }


                @dataclass
                class Qwen3MoeConfig:
                    num_experts: int = 128
                    moe_intermediate_size: int = 768
                    torch_dtype: torch.dtype = torch.bfloat16
            """,
            after="""
                _ALIASES = {
                    "moe_intermediate_size": ("moe_intermediate_size", "intermediate_size"),
                    "n_shared_experts": ("n_shared_experts", "num_shared_experts", "moe_num_shared_experts", "num_shared_expert"),
                    "num_experts": ("num_experts", "n_routed_experts"),
                    "shared_expert_intermediate_size": ("shared_expert_intermediate_size", "shared_intermediate_size"),
                }


                @dataclass
                class Qwen3MoeConfig:
                    num_experts: int = 128
                    moe_intermediate_size: int = 768
                    # <-- MODEL-SPECIFIC: fields of this architecture's features (sorted by name)
                    n_shared_experts: int | None = None
                    shared_expert_intermediate_size: int | None = None
                    torch_dtype: torch.dtype = torch.bfloat16
            """,
        ),
        Example(
            title="no experts class",
            before="""
                class LlamaMLP(nn.Module):
                    def forward(self, x):
                        return NF.mlp(x, self.gate_proj_weight, self.up_proj_weight, self.down_proj_weight)
            """,
            raises="no experts class",
        ),
    )

    @classmethod
    def params_for(cls, diffs, target, port: PortContext) -> SharedExpertsParams:
        return SharedExpertsParams(
            gate=bool(target.moe.shared_expert_gate), count=int(target.moe.shared_experts or 1)
        )

    # -- config.py -------------------------------------------------------------

    def _transform_config(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        if not moe_edits.has_config_aliases(module):
            # no alias table: the fields under the names Qwen2-MoE and DeepSeek-style
            # configs use, the count defaulting to the architecture's
            fields = [(f"n_shared_experts: int | None = {self.params.count}", ""), CONFIG_FIELDS[1]]
            return add_config_fields(module, ctx, fields)
        for name, keys in CONFIG_ALIASES.items():
            module = moe_edits.add_config_alias(module, ctx, name, keys)
        return add_config_fields(module, ctx, CONFIG_FIELDS)

    # -- model.py --------------------------------------------------------------

    def transform_module(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        if ctx.role == "config":
            return self._transform_config(module, ctx)
        found = anatomy_experts.experts_classes(module)
        if not found:
            raise ctx.precondition(
                "shared-experts: no experts class in this file (a <Prefix>Experts class calling NF.router)"
            )
        edits: dict = {}
        router_params: set[str] = set()
        added = False
        for survey in found:
            router = survey.router_param
            if router is None:
                raise self._missing(ctx, survey, "a router weight parameter (self.router_weight)", module)
            router_params.add(router)
            added |= self._edit_class(survey, edits, module, ctx)
        module = rewrite(module, edits)
        if added:
            module = ensure_import_from(module, WEIGHT_LOADERS, "sharding_weight_loader")
            if "with_rank_override(" in module.code:
                module = ensure_import_from(module, WEIGHT_LOADERS, "with_rank_override")
        module = add_functions(module, [code.WIDTH_FUNCTION, code.KEY_FUNCTION])
        return self._add_mappings(module, router_params, ctx)

    def _missing(self, ctx, survey, what, module):
        return ctx.precondition(f"shared-experts: {survey.cls.name.value} has no {what}", survey.cls, module)

    def _edit_class(self, survey, edits, module, ctx) -> bool:
        """The shared expert in one experts class: its parameters after the
        routed experts' (or its own), their loaders, the method computing it,
        and its output added on both paths. False when it is all there."""
        gate = self.params.gate
        layout = self._layout(survey, module, ctx)
        has_weights = all(w in survey.params for w in WEIGHTS)
        has_gate = GATE in survey.params
        if has_weights and (has_gate or not gate):
            return False
        new_gate = gate and not has_gate
        anchor = (
            _last_param_statement(layout.init, WEIGHTS) if has_weights else survey.params["down_proj_weight"]
        )
        edits[id(anchor)] = followed_by(*_parameters(layout, not has_weights, new_gate, module))
        last_loader = statements(layout.loaders)[-1]
        edits[id(last_loader)] = followed_by(*_loaders(layout, not has_weights, new_gate, module))
        method = code.shared_method(gate, module, "cross_dp_ep" in survey.assigned)
        existing = survey.methods.get(METHOD)
        if existing is not None:
            edits[id(existing)] = replaced_by(method)
        else:
            edits[id(layout.loaders)] = followed_by(method)
        if not has_weights:
            self._edit_prefill(layout.prefill, edits, module, ctx, survey)
            self._edit_decode(layout, edits, module, ctx, survey)
        return True

    def _layout(self, survey, module, ctx) -> _Layout:
        """What the experts class offers the shared expert (preconditions)."""
        if "down_proj_weight" not in survey.params:
            raise self._missing(ctx, survey, "self.down_proj_weight = nn.Parameter(...)", module)
        if "hidden_size" not in survey.assigned:
            raise self._missing(ctx, survey, "self.hidden_size attribute", module)
        methods = {}
        for name in ("__init__", "_setup_weight_loaders", "forward_prefill", "forward_decode"):
            methods[name] = survey.methods.get(name)
            if methods[name] is None:
                raise self._missing(ctx, survey, f"{name} method", module)
        norms = attr_of_role(survey.cls, module, "norm")
        if not norms:
            raise self._missing(
                ctx, survey, "norm module of its own (self.<norm> = <Prefix>RMSNorm(...))", module
            )
        dtype = "self.dtype" if "dtype" in survey.assigned else _dtype_of(survey.params["down_proj_weight"])
        if dtype is None:
            raise self._missing(ctx, survey, "self.dtype, nor a dtype= on self.down_proj_weight", module)
        decode = methods["forward_decode"]
        group = _output_group(decode)
        if group is None:
            raise ctx.precondition(
                f"shared-experts: forward_decode of {survey.cls.name.value} has no all-reduce of the routed "
                "output over one group (<group>.all_reduce(output)) for the shared expert to share",
                decode,
                module,
            )
        if group == "self.tp_group" and "world_size" in survey.assigned:
            shards, rank = "self.world_size", None
        else:
            shards, rank = f"{group}.world_size", f"{group}.rank_in_group"
        init = methods["__init__"]
        return _Layout(
            init=init,
            loaders=methods["_setup_weight_loaders"],
            prefill=methods["forward_prefill"],
            decode=decode,
            norm=norms[0],
            dtype=dtype,
            shards=shards,
            rank=rank,
            config=anatomy_experts.method_parameter(init, 0) or "config",
        )

    def _edit_prefill(self, prefill, edits, module, ctx, survey) -> None:
        """The shared expert's output added right after the statement computing the routed output."""
        routed = _routed_output(prefill)
        if routed is None or routed[2] is None:
            raise ctx.precondition(
                f"shared-experts: forward_prefill of {survey.cls.name.value} has no statement computing the "
                "routed output (output = self._experts_blockwise(hidden, ...) or output = NF.moe_cte(hidden_states=...))",
                prefill,
                module,
            )
        stmt, out, hidden = routed
        add = parse_statement(f"{out} = {out} + self.{METHOD}({code_of(hidden)})", module)
        edits[id(stmt)] = followed_by(add)

    def _edit_decode(self, layout: _Layout, edits, module, ctx, survey) -> None:
        """The shared expert's output on the normalized decode tokens added
        before the all-reduce (or the decode guarded when its expert kernel is
        chosen at run time)."""
        decode = layout.decode
        reduce = next(
            (
                (s, calls[0].args[0].value)
                for s in statements(decode)
                if (calls := _all_reduces(s, with_args=True))
            ),
            None,
        )
        inp = anatomy_experts.method_parameter(decode, 0)
        if reduce is None or inp is None or not isinstance(reduce[1], cst.Name):
            raise ctx.precondition(
                f"shared-experts: forward_decode of {survey.cls.name.value} has no all-reduce of its output "
                "(output = self.tp_group.all_reduce(output))",
                decode,
                module,
            )
        stmt, value = reduce
        out = value.value
        if _dispatched(decode, out):
            # the routed output comes from a kernel chosen at run time (an all-to-all
            # decode beside the fused one): where its partial sums meet is not known
            message = "shared experts: this decode chooses its expert kernel at run time (moe_func)"
            for site in anatomy_experts.moe_sites(module, "moe.experts"):
                if site.cls == survey.cls.name.value and site.function != layout.prefill.name.value:
                    ctx.unaffected(site.call, f"guarded: {message}")
            edits[id(stmt)] = preceded_by(parse_statement(f'raise NotImplementedError("{message}")', module))
            return
        add = parse_statement(f"{out} = {out} + self.{METHOD}(self.{layout.norm}({inp}))", module)
        edits[id(stmt)] = preceded_by(add)

    # -- load_weights ----------------------------------------------------------

    def _add_mappings(self, module, router_params, ctx):
        entries, keys, routers = _router_entries(module, router_params)
        if not routers:
            raise ctx.precondition(
                f"shared-experts: load_weights has no mappings[...{' / '.join(sorted(router_params))}] entry"
            )
        wanted = [*zip(WEIGHTS, ("gate_proj.weight", "up_proj.weight", "down_proj.weight"), strict=True)]
        if self.params.gate:
            wanted.append((GATE, None))
        if not moe_edits.function_assigns(module, routers[0].statement, "names"):
            module = moe_edits.add_tensor_names(module, ctx, routers[0].statement)
            entries, keys, routers = _router_entries(module, router_params)
        additions: dict[int, list] = {}
        for entry in routers:
            param = next(p for p in router_params if entry.key.endswith(f".{p}"))
            base = entry.key[: -len(param)]
            block = _block_key(entry.value, module)
            if block is None:
                raise ctx.precondition(
                    f"shared-experts: cannot derive the MoE block's checkpoint key from the mapping of "
                    f'{entry.key} (expected f"{{keys.router}}.weight" or a key ending in .gate.weight / '
                    ".router.weight)",
                    entry.statement,
                    module,
                )
            anchor = next((e for e in entries if e.key == base + "down_proj_weight"), entry)
            for attr, tensor in wanted:
                if base + attr in keys:
                    continue
                key = replace_string_suffix(entry.key_node, param, attr)
                if tensor is None:
                    value = parse_expr(block("shared_expert_gate.weight"), module)
                else:
                    value = parse_expr(f'_shared_expert_key(names, {block(None)}, "{tensor}")', module)
                additions.setdefault(id(anchor.statement), []).append(entry_statement(entry, key, value))
        return insert_many_after(module, additions)


def _router_entries(module: cst.Module, router_params: set[str]):
    """The mapping entries of ``load_weights``, their keys, and those of the router weights."""
    entries = mapping_entries(module)
    routers = [e for e in entries if any(e.key.endswith(f".{p}") for p in router_params)]
    return entries, {e.key for e in entries}, routers


@dataclass(frozen=True)
class _Layout:
    """What an experts class offers its shared expert: the methods edited,
    its own norm, the dtype of its weights, and the group its outputs are
    summed over (``shards`` ranks; ``rank`` in it, None for the TP rank the
    loaders default to)."""

    init: cst.FunctionDef
    loaders: cst.FunctionDef
    prefill: cst.FunctionDef
    decode: cst.FunctionDef
    norm: str
    dtype: str
    shards: str
    rank: str | None
    config: str


def _parameters(layout: _Layout, weights: bool, gate: bool, module: cst.Module) -> list[cst.BaseStatement]:
    """``__init__``'s new parameters: the shared expert's weights (intermediate
    sharded) and its gate, as asked."""
    new: list[cst.BaseStatement] = []
    if weights:
        new += parse_statements(code.parameters_code(layout.config, layout.shards, layout.dtype), module)
        new[0] = with_comment(
            new[0],
            "<-- MODEL-SPECIFIC: always-on shared expert (SiLU-gated MLP), intermediate sharded over TP",
        )
    if gate:
        comment = "<-- MODEL-SPECIFIC: a sigmoid gate (float32, like the router) scales the shared expert's output per token"
        new.append(with_comment(parse_statement(code.GATE_PARAMETER, module), comment))
    return new


def _loaders(layout: _Layout, weights: bool, gate: bool, module: cst.Module) -> list[cst.BaseStatement]:
    """``_setup_weight_loaders``' new statements: sharding loaders of the
    shared expert's weights (with the group's rank when it is not TP's) and a
    replicated one for its gate, as asked."""
    new: list[cst.BaseStatement] = []
    if weights:
        new += parse_statements(code.loaders_code(layout.shards, layout.rank), module)
        new[0] = with_comment(
            new[0],
            ">>> PARALLELISM: the shared expert's intermediate dimension is sharded like a dense MLP's <<<",
        )
    if gate:
        new += parse_statements(code.GATE_LOADER, module)
    return new


def _routed_output(
    prefill: cst.FunctionDef,
) -> tuple[cst.BaseStatement, str, cst.BaseExpression | None] | None:
    """The last statement of ``prefill`` computing the routed output
    (``out = NF.moe_cte(hidden_states=...)`` or ``out = self._experts...(hidden, ...)``):
    the statement, ``out`` and the hidden states it routes."""
    routed = None
    for stmt in statements(prefill):
        pair = simple_assign(stmt)
        if pair is None or not isinstance(pair[0], cst.Name) or not isinstance(pair[1], cst.Call):
            continue
        call = pair[1]
        if is_call(call, anatomy_experts.BLOCKWISE_KERNEL):
            arg = keyword_arg(call, "hidden_states")
            routed = (stmt, pair[0].value, arg.value if arg else None)
        elif self_attr(call.func) is not None and self_attr(call.func).startswith("_experts") and call.args:
            routed = (stmt, pair[0].value, call.args[0].value)
    return routed


def _last_param_statement(init: cst.FunctionDef, attrs) -> cst.CSTNode:
    last = None
    for node in walk(init):
        if isinstance(node, cst.SimpleStatementLine):
            pair = simple_assign(node)
            if pair is not None and self_attr(pair[0]) in attrs:
                last = node
    return last


def _block_key(value: cst.BaseExpression, module: cst.Module):
    """From the router weight's checkpoint key, a function: suffix -> source
    of the key ``<MoE block>.<suffix>``, or with ``None`` the source of the
    MoE block's key itself."""
    text = string_text(value)
    if text is None:
        return None
    if isinstance(value, cst.FormattedString) and len(value.parts) == 2:
        head, tail = value.parts
        if (
            isinstance(head, cst.FormattedStringExpression)
            and isinstance(head.expression, cst.Attribute)
            and head.expression.attr.value == "router"
            and isinstance(tail, cst.FormattedStringText)
            and tail.value == ".weight"
        ):
            owner = code_of(head.expression.value)
            return lambda suffix: f"{owner}.module" if suffix is None else f'f"{{{owner}.module}}.{suffix}"'
    for router in (".gate.weight", ".router.weight"):
        if text.endswith(router):
            prefix = "f" if isinstance(value, cst.FormattedString) else ""
            body = text[: -len(router)]
            return lambda suffix, body=body, prefix=prefix: (
                f'{prefix}"{body}"' if suffix is None else f'{prefix}"{body}.{suffix}"'
            )
    return None


def _dtype_of(statement: cst.CSTNode) -> str | None:
    """The ``dtype=`` of the tensor a parameter statement creates."""
    for node in walk(statement):
        if isinstance(node, cst.Call):
            arg = keyword_arg(node, "dtype")
            if arg is not None:
                return code_of(arg.value)
    return None


def _output_group(decode: cst.FunctionDef) -> str | None:
    """The group the decode path sums the routed partial outputs over
    (``<group>.all_reduce(output)``), leaving out the world-wide group of
    cross-DP expert parallelism; None when it is not one group."""
    groups = []
    for call in _all_reduces(decode):
        group = dotted(call.func.value)
        if group is not None and "wide" not in group and group not in groups:
            groups.append(group)
    return groups[0] if len(groups) == 1 else None


def _all_reduces(node: cst.CSTNode, with_args: bool = False) -> list[cst.Call]:
    """The ``<group>.all_reduce(...)`` calls under ``node`` (with an argument)."""
    return [
        n
        for n in walk(node)
        if isinstance(n, cst.Call)
        and isinstance(n.func, cst.Attribute)
        and n.func.attr.value == "all_reduce"
        and (n.args or not with_args)
    ]


def _dispatched(decode: cst.FunctionDef, out: str) -> bool:
    """Whether ``decode`` computes ``out`` by calling a local name (a kernel
    method picked at run time, ``moe_func = ... if ... else ...``)."""
    for stmt in statements(decode):
        pair = simple_assign(stmt) if isinstance(stmt, cst.SimpleStatementLine) else None
        if pair is not None and code_of(pair[0]) == out and isinstance(pair[1], cst.Call):
            if isinstance(pair[1].func, cst.Name):
                return True
    return False
