"""dense-layers: some decoder layers of a mixture-of-experts model have a dense MLP instead of experts."""

from __future__ import annotations

import libcst as cst

from autoport_cst.spec.pitfalls import Pitfall
from autoport_cst.transform import Codemod, Example, FileContext, NoParams
from autoport_cst.transform.anatomy import experts as anatomy_experts
from autoport_cst.transform.anatomy.mappings import mapping_entries
from autoport_cst.transform.anatomy.sites import find_sites
from autoport_cst.transform.cst.roles import split_prefix
from autoport_cst.transform.cst.snippets import parse_statement
from autoport_cst.transform.cst.vocabulary import (
    classes_with_role,
    code_of,
    dotted,
    method,
    self_assignment,
    walk,
)
from autoport_cst.transform.edit.config_fields import add_config_fields
from autoport_cst.transform.edit.dense_mlp_code import RULE, RULE_FUNCTION, TEMPLATES
from autoport_cst.transform.edit.functions import add_functions
from autoport_cst.transform.edit.imports import ensure_import_from
from autoport_cst.transform.edit.tree import rewrite, with_comment
from autoport_cst.transform.realizes import Realizes, not_to

ID = "dense-layers"
DENSE_SUFFIX = "DenseMLP"

CONFIG_FIELDS = [
    ("decoder_sparse_step: int | None = None", ""),
    ("first_k_dense_replace: int | None = None", ""),
    ("interleave_moe_layer_step: int | None = None", ""),
    ("intermediate_size: int | None = None", ""),
    ("intermediate_size_mlp: int | None = None", ""),
    ("mlp_layer_types: list[str] | None = None", ""),
    ("mlp_only_layers: list[int] | None = None", ""),
    ("moe_layer_end_index: int | None = None", ""),
    ("moe_layer_interval: int | None = None", ""),
    ("moe_layer_start_index: int | None = None", ""),
    ("moe_layers: list[int] | None = None", ""),
    ("num_dense_layers: int | None = None", ""),
]

DENSE_ENTRIES = (
    ("{norm_attr}.weight", "post_attention_layernorm.weight"),
    ("gate_proj_weight", "mlp.gate_proj.weight"),
    ("up_proj_weight", "mlp.up_proj.weight"),
    ("down_proj_weight", "mlp.down_proj.weight"),
)


class DenseLayers(Codemod):
    """Give the layers that the config marks dense a SiLU-gated MLP instead of the experts.

    DeepSeek-V3, GLM-4-MoE, Dots1, ERNIE-4.5-MoE and others replace the
    experts of some layers (usually the first few) by a dense MLP of width
    ``intermediate_size`` (``intermediate_size_mlp`` when the config gives it,
    Llama 4's, whose ``intermediate_size`` is the experts' width). Which
    layers is read from the config at run time by
    ``_layer_is_dense(config, layer_idx)`` (added to the model file), which
    understands the forms the configs use: ``mlp_layer_types``,
    ``first_k_dense_replace``, ``num_dense_layers``, ``moe_layer_interval``
    with ``moe_layer_start_index`` / ``moe_layer_end_index``, ``moe_layers``
    or ``interleave_moe_layer_step`` (Llama 4), and ``mlp_only_layers`` with
    ``decoder_sparse_step``.

    Model file:

    - a class ``<Prefix>DenseMLP`` after the MoE wrapper (``<Prefix>MLP``, the
      MLP class that holds ``self.experts``): the experts' own pre-MLP norm
      statement (copied, so the norm class and eps key stay the port's), the
      gate/up/down weights sharded on the intermediate dimension, and a
      ``forward`` taking what the wrapper's takes, with the collectives of a
      dense MLP in that layout around ``NF.mlp``. For ``(hidden_states,
      positions, is_prefill)``: sharded over TP, SP all-gather and
      reduce-scatter in prefill, all-reduce over TP in decode. For the real
      packages' ``(hidden_states, positions, is_decode, rank)``, whose decode
      rows arrive in the MLP-DP state (the batches of every MLP-DP rank):
      sharded over the MLP TP group (TP * MLP DP, loaders with its rank
      override, as the experts and the dense references' MLP), SP all-gather
      and reduce-scatter over TP in prefill, all-reduce over the MLP TP group
      in decode;
    - the decoder layer builds it where ``_layer_is_dense`` says so:
      ``self.mlp = <Prefix>DenseMLP(config) if _layer_is_dense(config,
      layer_idx) else <Prefix>MLP(config)``;
    - ``load_weights``: the per-layer statements about the experts (the
      ``mappings[f"{prefix}.mlp...."]`` entries and the variables they read,
      such as ``moe = moe_checkpoint_keys(...)``) move under ``if not
      _layer_is_dense(self.config, layer_id):``; the ``else`` branch maps the
      dense MLP to ``<layer>.mlp.{gate,up,down}_proj.weight`` and its norm to
      ``<layer>.post_attention_layernorm.weight``.

    Config file: the fields the rule reads, and ``intermediate_size``.

    Only ``self.mlp`` changes among the sublayer calls of the decoder layer's
    forwards (its attention calls are declared unaffected). A wrapper whose
    ``forward`` takes anything else is refused, naming its signature and the
    two a dense class is written for.

    Preconditions: one MoE wrapper class holding ``self.experts``, an experts
    class with its own norm module (``self.<norm> = <Prefix>RMSNorm(...)``), a
    decoder layer whose ``__init__(self, config, layer_idx)`` sets ``self.mlp``
    to the wrapper, and a ``load_weights`` loop over the layers with
    ``mappings[f"{prefix}.mlp...."]`` entries.
    """

    ID = ID
    REALIZES = Realizes({"moe.dense_layers": not_to(None)})
    Params = NoParams
    PITFALLS = (
        Pitfall(
            350,
            lambda spec, facts: facts.value("code.dense_layers"),
            lambda spec, facts: (
                f"dense MLP layers inside an MoE model ({facts.value('code.dense_layers')}): "
                "the spec describes the MoE layers only"
            ),
        ),
    )
    FILES = ("model", "config")
    EXAMPLES = (
        Example(
            title="the layers the config marks dense get an MLP instead of the experts",
            before="""
                import vllm_neuron.functional as NF
                from vllm_neuron.utils.weight_loader import set_weight_loader


                class Qwen3MoeExperts(nn.Module):
                    def __init__(self, config: Qwen3MoeConfig):
                        super().__init__()
                        self.post_attention_layernorm = Qwen3MoeRMSNorm(
                            config.hidden_size, config.rms_norm_eps, config.torch_dtype
                        )

                    def _route(self, hidden_states):
                        return NF.router(hidden_states, router_weights=self.router_weight.T, top_k=2)


                class Qwen3MoeMLP(nn.Module):
                    def __init__(self, config: Qwen3MoeConfig):
                        super().__init__()
                        self.experts = Qwen3MoeExperts(config)


                class Qwen3MoeDecoderLayer(nn.Module):
                    def __init__(self, config: Qwen3MoeConfig, layer_idx: int):
                        super().__init__()
                        self.mlp = Qwen3MoeMLP(config)


                class Qwen3MoeForCausalLM(nn.Module):
                    def load_weights(self, checkpoint_path):
                        mappings = {}
                        for layer_id in range(len(self.model.layers)):
                            prefix = f"model.layers.{layer_id}"
                            moe = moe_checkpoint_keys(names, prefix, self.config.num_experts)
                            mappings[f"{prefix}.input_layernorm.weight"] = f"{prefix}.input_layernorm.weight"
                            mappings[f"{prefix}.mlp.experts.router_weight"] = f"{moe.router}.weight"
            """,
            after='''
                import vllm_neuron.functional as NF
                from vllm_neuron.utils.weight_loader import set_weight_loader, sharding_weight_loader


                def _layer_is_dense(config, layer_idx: int) -> bool:
                    """Whether decoder layer ``layer_idx`` has a dense MLP instead of the experts.

                    Mixture-of-experts configs say it in one of these forms (the first one the
                    config has decides): ``mlp_layer_types`` ("dense" or "sparse" per layer);
                    ``first_k_dense_replace`` or ``num_dense_layers`` (the first k layers are
                    dense); ``moe_layer_interval`` with ``moe_layer_start_index`` and
                    ``moe_layer_end_index`` (experts on every interval-th layer of that range);
                    ``moe_layers`` (the layers with experts, listed) or
                    ``interleave_moe_layer_step`` (experts on every step-th layer: Llama 4);
                    ``mlp_only_layers`` (listed layers are dense) with ``decoder_sparse_step``
                    (experts on every step-th layer). A config with none of them has experts
                    on every layer.
                    """
                    if config.mlp_layer_types is not None:
                        return config.mlp_layer_types[layer_idx] != "sparse"
                    if config.first_k_dense_replace is not None:
                        return layer_idx < config.first_k_dense_replace
                    if config.num_dense_layers is not None:
                        return layer_idx < config.num_dense_layers
                    if config.moe_layer_interval is not None:
                        start = config.moe_layer_start_index or 0
                        end = config.moe_layer_end_index
                        if end is None or end < 0:
                            end = config.num_hidden_layers - 1
                        return not (start <= layer_idx <= end and (layer_idx + 1) % config.moe_layer_interval == 0)
                    if config.moe_layers is not None:
                        return layer_idx not in config.moe_layers
                    if config.interleave_moe_layer_step is not None:
                        return (layer_idx + 1) % config.interleave_moe_layer_step != 0
                    if layer_idx in (config.mlp_only_layers or ()):
                        return True
                    return (layer_idx + 1) % (config.decoder_sparse_step or 1) != 0


                class Qwen3MoeExperts(nn.Module):
                    def __init__(self, config: Qwen3MoeConfig):
                        super().__init__()
                        self.post_attention_layernorm = Qwen3MoeRMSNorm(
                            config.hidden_size, config.rms_norm_eps, config.torch_dtype
                        )

                    def _route(self, hidden_states):
                        return NF.router(hidden_states, router_weights=self.router_weight.T, top_k=2)


                class Qwen3MoeMLP(nn.Module):
                    def __init__(self, config: Qwen3MoeConfig):
                        super().__init__()
                        self.experts = Qwen3MoeExperts(config)


                class Qwen3MoeDenseMLP(nn.Module):
                    """The dense feed-forward block of the layers without experts: a SiLU-gated
                    MLP with the pre-MLP norm in front of it, like the experts (so that the
                    decoder layer calls both alike)."""

                    def __init__(self, config: Qwen3MoeConfig):
                        super().__init__()
                        self.dtype = config.torch_dtype
                        self.hidden_size = config.hidden_size

                        # >>> PARALLELISM: TP group setup <<<
                        self.tp_group = get_tp_group()
                        self.world_size = self.tp_group.world_size

                        # >>> PARALLELISM: intermediate dimension sharded over TP <<<
                        # <-- MODEL-SPECIFIC: the dense width (intermediate_size_mlp when the config gives one: Llama 4)
                        self.intermediate_size_per_rank = (config.intermediate_size_mlp or config.intermediate_size) // self.world_size

                        # <-- MODEL-SPECIFIC: pre-MLP norm (the decoder layer's post-attention norm)
                        self.post_attention_layernorm = Qwen3MoeRMSNorm(
                            config.hidden_size, config.rms_norm_eps, config.torch_dtype
                        )
                        # <-- MODEL-SPECIFIC: SiLU-gated MLP; gate/up stored [H, I/tp], down [I/tp, H]
                        self.gate_proj_weight = nn.Parameter(
                            torch.empty(self.hidden_size, self.intermediate_size_per_rank, dtype=self.dtype)
                        )
                        self.up_proj_weight = nn.Parameter(
                            torch.empty(self.hidden_size, self.intermediate_size_per_rank, dtype=self.dtype)
                        )
                        self.down_proj_weight = nn.Parameter(
                            torch.empty(self.intermediate_size_per_rank, self.hidden_size, dtype=self.dtype)
                        )
                        self._setup_weight_loaders()

                    def _setup_weight_loaders(self):
                        """>>> PARALLELISM: each rank loads its slice of the intermediate dimension. <<<"""
                        for weight in (self.gate_proj_weight, self.up_proj_weight):
                            set_weight_loader(
                                weight,
                                sharding_weight_loader(
                                    shard_dim=1,
                                    shard_size=self.intermediate_size_per_rank,
                                    num_shards=self.world_size,
                                    is_storage_transposed=True,
                                ),
                            )
                        set_weight_loader(
                            self.down_proj_weight,
                            sharding_weight_loader(
                                shard_dim=0,
                                shard_size=self.intermediate_size_per_rank,
                                num_shards=self.world_size,
                                is_storage_transposed=True,
                            ),
                        )

                    def forward(self, hidden_states: torch.Tensor, positions: torch.Tensor, is_prefill: bool):
                        """This rank's SP slice [T / world_size, H] in prefill, [B * S, H] in decode."""
                        hidden_states = self.post_attention_layernorm(hidden_states.to(self.dtype))
                        # >>> PARALLELISM: All-gather from SP before the MLP <<<
                        if is_prefill and self.world_size > 1:
                            hidden_states = self.tp_group.all_gather(hidden_states, dim=0)
                        output = NF.mlp(hidden_states, self.gate_proj_weight, self.up_proj_weight, self.down_proj_weight)
                        # >>> PARALLELISM: reduce-scatter back to SP (prefill) or sum the partial outputs (decode) <<<
                        if self.world_size > 1:
                            if is_prefill:
                                output = self.tp_group.reduce_scatter(output, dim=0)
                            else:
                                output = self.tp_group.all_reduce(output)
                        return output


                class Qwen3MoeDecoderLayer(nn.Module):
                    def __init__(self, config: Qwen3MoeConfig, layer_idx: int):
                        super().__init__()
                        # <-- MODEL-SPECIFIC: a dense MLP instead of the experts on the layers the config marks dense
                        self.mlp = Qwen3MoeDenseMLP(config) if _layer_is_dense(config, layer_idx) else Qwen3MoeMLP(config)


                class Qwen3MoeForCausalLM(nn.Module):
                    def load_weights(self, checkpoint_path):
                        mappings = {}
                        for layer_id in range(len(self.model.layers)):
                            prefix = f"model.layers.{layer_id}"
                            mappings[f"{prefix}.input_layernorm.weight"] = f"{prefix}.input_layernorm.weight"
                            # <-- MODEL-SPECIFIC: the experts, or the dense MLP of the layers without them
                            if not _layer_is_dense(self.config, layer_id):
                                moe = moe_checkpoint_keys(names, prefix, self.config.num_experts)
                                mappings[f"{prefix}.mlp.experts.router_weight"] = f"{moe.router}.weight"
                            else:
                                mappings[f"{prefix}.mlp.post_attention_layernorm.weight"] = f"{prefix}.post_attention_layernorm.weight"
                                mappings[f"{prefix}.mlp.gate_proj_weight"] = f"{prefix}.mlp.gate_proj.weight"
                                mappings[f"{prefix}.mlp.up_proj_weight"] = f"{prefix}.mlp.up_proj.weight"
                                mappings[f"{prefix}.mlp.down_proj_weight"] = f"{prefix}.mlp.down_proj.weight"
            ''',
        ),
        Example(
            title="config: the fields the rule reads",
            role="config",
            path="config.py",
            before="""
                @dataclass
                class Qwen3MoeConfig:
                    num_experts: int = 128
                    torch_dtype: torch.dtype = torch.bfloat16
            """,
            after="""
                @dataclass
                class Qwen3MoeConfig:
                    num_experts: int = 128
                    # <-- MODEL-SPECIFIC: fields of this architecture's features (sorted by name)
                    decoder_sparse_step: int | None = None
                    first_k_dense_replace: int | None = None
                    interleave_moe_layer_step: int | None = None
                    intermediate_size: int | None = None
                    intermediate_size_mlp: int | None = None
                    mlp_layer_types: list[str] | None = None
                    mlp_only_layers: list[int] | None = None
                    moe_layer_end_index: int | None = None
                    moe_layer_interval: int | None = None
                    moe_layer_start_index: int | None = None
                    moe_layers: list[int] | None = None
                    num_dense_layers: int | None = None
                    torch_dtype: torch.dtype = torch.bfloat16
            """,
        ),
        Example(
            title="no MoE wrapper",
            before="""
                class LlamaMLP(nn.Module):
                    def forward(self, x):
                        return NF.mlp(x, self.gate_proj_weight, self.up_proj_weight, self.down_proj_weight)
            """,
            raises="no MoE wrapper",
        ),
    )

    def transform_module(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        if ctx.role == "config":
            return add_config_fields(module, ctx, CONFIG_FIELDS)
        wrapper = _moe_wrapper(module)
        if wrapper is None:
            raise ctx.precondition(
                "dense-layers: no MoE wrapper in this file (a <Prefix>MLP class that sets self.experts)"
            )
        experts = anatomy_experts.experts_classes(module)
        if len(experts) != 1:
            raise ctx.precondition(
                f"dense-layers: expected one experts class (<Prefix>Experts calling NF.router), found {len(experts)}"
            )
        norm = _norm_statement(experts[0].cls)
        if norm is None:
            raise ctx.precondition(
                f"dense-layers: {experts[0].cls.name.value} has no norm module of its own "
                "(self.<norm> = <Prefix>RMSNorm(...))",
                experts[0].cls,
                module,
            )
        template, imports = _template_for(wrapper, ctx, module)
        split = split_prefix(wrapper.name.value)
        dense_name = f"{split[0]}{DENSE_SUFFIX}"
        edits: dict = {}
        self._dense_class(module, wrapper, dense_name, norm, template, edits)
        self._decoder_layer(module, ctx, wrapper.name.value, dense_name, edits)
        self._load_weights(module, ctx, norm, edits)
        for site in find_sites(module, "decoder.sublayer"):
            if site.kind != "self.mlp":
                ctx.unaffected(site.node, "dense-layers changes which MLP a layer builds, not its attention")
        module = rewrite(module, edits)
        module = add_functions(module, [RULE_FUNCTION])
        for source, name in imports:
            module = ensure_import_from(module, source, name)
        return module

    # -- the dense MLP class -----------------------------------------------------------

    def _dense_class(self, module, wrapper, dense_name, norm, template, edits) -> None:
        if any(c.name.value == dense_name for c in module.body if isinstance(c, cst.ClassDef)):
            return
        init = method(wrapper, "__init__")
        params = [p for p in init.params.params if p.name.value != "self"] if init else []
        config = code_of(params[0]) if params else "config"
        norm_attr = self_assignment(norm)[0]
        source = template.format(name=dense_name, config=config, norm="{norm}", norm_attr=norm_attr)
        cls = parse_statement(source.strip("\n"), module)
        cls = _replace_placeholder(cls, norm, module)
        cls = cls.with_changes(leading_lines=[cst.EmptyLine(indent=False), cst.EmptyLine(indent=False)])
        edits[id(wrapper)] = lambda updated, cls=cls: cst.FlattenSentinel([updated, cls])

    # -- the decoder layer --------------------------------------------------------------

    def _decoder_layer(self, module, ctx, wrapper_name, dense_name, edits) -> None:
        layers = classes_with_role(module, "decoder_layer")
        if not layers:
            raise ctx.precondition("dense-layers: no decoder layer class (<Prefix>DecoderLayer) in this file")
        for layer in layers:
            init = method(layer, "__init__")
            params = [p.name.value for p in init.params.params if p.name.value != "self"] if init else []
            if init is None or len(params) < 2:
                raise ctx.precondition(
                    f"dense-layers: {layer.name.value}.__init__ does not take (config, layer_idx)",
                    layer,
                    module,
                )
            config = params[0]
            layer_idx = "layer_idx" if "layer_idx" in params else params[1]
            site = None
            for node in walk(init):
                if isinstance(node, cst.SimpleStatementLine):
                    pair = self_assignment(node)
                    if pair is not None and pair[0] == "mlp":
                        site = (node, pair[1])
                        break
            if site is None:
                raise ctx.precondition(
                    f"dense-layers: {layer.name.value}.__init__ sets no self.mlp", init, module
                )
            stmt, value = site
            if isinstance(value, cst.IfExp):
                continue  # already chooses per layer
            if not (isinstance(value, cst.Call) and dotted(value.func) == wrapper_name):
                raise ctx.precondition(
                    f"dense-layers: {layer.name.value} sets self.mlp to {code_of(value)}, not to the MoE "
                    f"wrapper {wrapper_name}(...)",
                    stmt,
                    module,
                )
            args = code_of(value)[len(wrapper_name) :]
            new = parse_statement(
                f"self.mlp = {dense_name}{args} if {RULE}({config}, {layer_idx}) else {code_of(value)}",
                module,
            )
            new = with_comment(
                new,
                "<-- MODEL-SPECIFIC: a dense MLP instead of the experts on the layers the config marks dense",
            )
            edits[id(stmt)] = lambda updated, new=new: new.with_changes(
                leading_lines=[*updated.leading_lines, *new.leading_lines]
            )

    # -- load_weights ---------------------------------------------------------------------

    def _load_weights(self, module, ctx, norm, edits) -> None:
        """In each loop over the layers of ``load_weights``: the expert
        entries (and the statements only they read) under ``if not <rule>``,
        the dense MLP's entries under its ``else``."""
        loops = _expert_entry_loops(module)
        if not loops:
            if any(
                isinstance(n, cst.If) and RULE in code_of(n.test)
                for cls in classes_with_role(module, "causal_lm")
                for n in walk(cls)
            ):
                return
            raise ctx.precondition(
                'dense-layers: no load_weights loop over the layers with mappings[f"{prefix}.mlp...."] entries'
            )
        norm_attr = self_assignment(norm)[0]
        for loop in loops:
            body = list(loop.body.body)
            if any(isinstance(s, cst.If) and RULE in code_of(s.test) for s in body):
                continue
            moe_entries = [e for e in mapping_entries(list(body)) if _is_moe_key(e.key)]
            moved_ids = _moved_with_entries(body, moe_entries)
            key = moe_entries[0].key
            prefix_var = key[1 : key.index("}")] if key.startswith("{") else None
            if prefix_var is None:
                raise ctx.precondition(
                    f"dense-layers: the expert entries' keys do not start with the layer prefix ({key})",
                    moe_entries[0].statement,
                    module,
                )
            block = _rule_block(
                [s for s in body if id(s) in moved_ids], code_of(loop.target), prefix_var, norm_attr, module
            )
            entry_ids = {id(e.statement) for e in moe_entries}
            first = next(i for i, s in enumerate(body) if id(s) in entry_ids)
            new_body = [s for i, s in enumerate(body) if id(s) not in moved_ids or i == first]
            new_body = [block if s is body[first] else s for s in new_body]
            edits[id(loop)] = lambda updated, new_body=new_body: updated.with_changes(
                body=updated.body.with_changes(body=new_body)
            )


def _expert_entry_loops(module: cst.Module) -> list[cst.For]:
    """The loops of the causal LMs' ``load_weights`` that map expert keys."""
    loops = []
    for cls in classes_with_role(module, "causal_lm"):
        load = method(cls, "load_weights")
        if load is None:
            continue
        for node in walk(load):
            if isinstance(node, cst.For) and any(_is_moe_key(e.key) for e in mapping_entries(node.body)):
                loops.append(node)
    return loops


def _moved_with_entries(body: list, moe_entries) -> set[int]:
    """The statements that move under the rule: the expert entries, and the
    variables only they read (``moe = moe_checkpoint_keys(...)``)."""
    moved_ids = {id(e.statement) for e in moe_entries}
    read_by_moe = {n.value for e in moe_entries for n in walk(e.value) if isinstance(n, cst.Name)}
    for stmt in body:
        if id(stmt) in moved_ids or not isinstance(stmt, cst.SimpleStatementLine):
            continue
        pair = _assigned_name(stmt)
        if pair is not None and pair in read_by_moe and not _read_elsewhere(body, stmt, moved_ids, pair):
            moved_ids.add(id(stmt))
    return moved_ids


def _rule_block(
    moved: list, layer: str, prefix_var: str, norm_attr: str, module: cst.Module
) -> cst.BaseStatement:
    """``if not <rule>(self.config, <layer>):`` the moved statements, ``else:`` the dense MLP's entries."""
    dense = "\n".join(
        f'    mappings[f"{{{prefix_var}}}.mlp.{param.format(norm_attr=norm_attr)}"] = f"{{{prefix_var}}}.{ckpt}"'
        for param, ckpt in DENSE_ENTRIES
    )
    block = parse_statement(f"if not {RULE}(self.config, {layer}):\n    pass\nelse:\n{dense}\n", module)
    block = block.with_changes(
        body=block.body.with_changes(  # type: ignore[attr-defined]
            body=[s.with_changes(leading_lines=[]) if i == 0 else s for i, s in enumerate(moved)]
        )
    )
    return with_comment(block, "<-- MODEL-SPECIFIC: the experts, or the dense MLP of the layers without them")


def _moe_wrapper(module: cst.Module) -> cst.ClassDef | None:
    for cls in classes_with_role(module, "mlp"):
        init = method(cls, "__init__")
        if init is None:
            continue
        for node in walk(init):
            if isinstance(node, cst.SimpleStatementLine):
                pair = self_assignment(node)
                if pair is not None and pair[0] == "experts":
                    return cls
    return None


def _template_for(wrapper: cst.ClassDef, ctx: FileContext, module: cst.Module):
    """The dense class (and its imports) written for the signature of the MoE
    wrapper's ``forward``, which the decoder layer calls ``self.mlp`` with; a
    wrapper without ``forward`` gets the plain one. Any other signature is
    refused, naming it and the ones a dense class exists for."""
    forward = method(wrapper, "forward")
    if forward is None:
        return TEMPLATES[("hidden_states", "positions", "is_prefill")]
    taken = tuple(p.name.value for p in forward.params.params if p.name.value != "self")
    if taken not in TEMPLATES:
        known = " or ".join(f"({', '.join(signature)})" for signature in TEMPLATES)
        raise ctx.precondition(
            f"dense-layers: the MoE wrapper {wrapper.name.value}.forward takes ({', '.join(taken)}); a dense "
            f"MLP class (and the collectives of its layout) is written only for {known}",
            forward,
            module,
        )
    return TEMPLATES[taken]


def _norm_statement(cls: cst.ClassDef) -> cst.SimpleStatementLine | None:
    from autoport_cst.transform.cst.roles import class_role

    init = method(cls, "__init__")
    for node in walk(init) if init is not None else []:
        if isinstance(node, cst.SimpleStatementLine):
            pair = self_assignment(node)
            if (
                pair is not None
                and isinstance(pair[1], cst.Call)
                and class_role(dotted(pair[1].func) or "") == "norm"
            ):
                return node
    return None


def _replace_placeholder(
    cls: cst.ClassDef, norm: cst.SimpleStatementLine, module: cst.Module
) -> cst.ClassDef:
    """Put the experts' norm statement where the class template has ``{norm}``."""
    init = method(cls, "__init__")
    for node in walk(init):
        if (
            isinstance(node, cst.SimpleStatementLine)
            and len(node.body) == 1
            and isinstance(node.body[0], cst.Expr)
            and isinstance(node.body[0].value, cst.Set)
        ):
            placeholder = node
            break
    else:  # pragma: no cover - the template has the placeholder
        raise AssertionError("template without {norm}")
    new = norm.with_changes(leading_lines=placeholder.leading_lines)
    return rewrite(cls, {id(placeholder): lambda updated, new=new: new})


def _is_moe_key(key: str) -> bool:
    return key.startswith("{") and ".mlp." in key and key.index(".mlp.") == key.index("}") + 1


def _assigned_name(stmt: cst.SimpleStatementLine) -> str | None:
    if len(stmt.body) == 1 and isinstance(stmt.body[0], cst.Assign) and len(stmt.body[0].targets) == 1:
        target = stmt.body[0].targets[0].target
        if isinstance(target, cst.Name):
            return target.value
    return None


def _read_elsewhere(body, stmt, moved_ids, name) -> bool:
    for other in body:
        if other is stmt or id(other) in moved_ids:
            continue
        if any(isinstance(n, cst.Name) and n.value == name for n in walk(other)):
            return True
    return False
