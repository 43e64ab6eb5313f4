"""routing-bias: a per-expert bias moves which experts are chosen, not their weights."""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from autoport_cst.spec.pitfalls import Pitfall
from autoport_cst.transform import Codemod, Example, FileContext
from autoport_cst.transform.anatomy import experts as anatomy_experts
from autoport_cst.transform.anatomy.mappings import mapping_entries
from autoport_cst.transform.cst.snippets import parse_expr, parse_statement, parse_statements
from autoport_cst.transform.cst.vocabulary import (
    code_of,
    is_docstring,
    keyword_arg,
    simple_assign,
    statements,
    walk,
)
from autoport_cst.transform.edit import moe as moe_edits
from autoport_cst.transform.edit.arguments import set_keyword
from autoport_cst.transform.edit.functions import add_functions
from autoport_cst.transform.edit.imports import ensure_import_from
from autoport_cst.transform.edit.tree import rewrite
from autoport_cst.transform.realizes import Realizes, to

BIAS = "routing_bias"
WEIGHT_LOADERS = "vllm_neuron.utils.weight_loader"

KEY_FUNCTION = '''
def _routing_bias_key(names, router: str, block: str, tensor: str) -> str:
    """Checkpoint key of the per-expert routing bias ``tensor``: under the
    router module (DeepSeek-V3, GLM-4-MoE), under the router's
    ``moe_statics`` (ERNIE-4.5-MoE) or under the MoE block (Hunyuan)."""
    for key in (f"{router}.{tensor}", f"{router}.moe_statics.{tensor}", f"{block}.{tensor}"):
        if key in names:
            return key
    raise KeyError(
        f"no routing bias in the checkpoint for {block} (looked for {router}.{tensor}, "
        f"{router}.moe_statics.{tensor}, {block}.{tensor})"
    )
'''

LOADER_FUNCTION = '''
def _vector_loader():
    """Loader of a per-expert vector stored [E] or [1, E]: read whole, flattened to [E]."""

    def transform(slices, rank):
        return slices[0][:].reshape(-1)

    return SafetensorsWeightLoader(transform)
'''
FLAG = "fused_decode"
COMMENT = "# <-- MODEL-SPECIFIC: the routing bias moves which experts are chosen, not their weights"


@dataclass(frozen=True)
class RoutingBiasParams:
    checkpoint_name: str = field(
        default="e_score_correction_bias",
        metadata={"doc": "Name of the bias tensor under the router module in the checkpoint."},
    )


class RoutingBias(Codemod):
    """Add a per-expert routing bias used for expert selection only (DeepSeek-V3's
    ``e_score_correction_bias``).

    The experts are chosen by ``scores + bias``; the chosen experts' weights
    stay the unbiased scores (renormalized when the model's
    ``norm_topk_prob`` says so), as in Hugging Face's DeepSeek-V3, Dots1 and
    GLM-4-MoE routers. In the experts class (``<Prefix>Experts``, the class
    that calls ``NF.router``):

    - ``__init__``: ``self.routing_bias = nn.Parameter(torch.zeros(E,
      dtype=torch.float32))`` after the router weight (and after a router
      bias when there is one);
    - the routing method, which takes the logits back from ``NF.router``
      (``selected, logits = NF.router(..., return_logits=True)``) and turns
      them into ``scores``: after the scores statement, the top-k choice is
      recomputed from ``scores + self.routing_bias`` and rebinds the
      selection mask (``selected``);
    - decode: the fused kernel ``NF.moe_block_tkg`` has no selection-only
      bias, so ``self.fused_decode`` becomes ``False`` and decode runs the
      routing method and the blockwise expert kernel instead.

    In ``load_weights`` the mapping gains ``...routing_bias`` next to the
    router's entries: the ``<checkpoint_name>`` tensor found in the
    checkpoint by ``_routing_bias_key(names, router, block, tensor)`` (added
    to the model file) under the router module
    (``...mlp.gate.e_score_correction_bias``), its ``moe_statics``
    (ERNIE-4.5) or the MoE block (Hunyuan); ``_vector_loader()`` reads it
    flattened, since some checkpoints store it ``[1, E]``.

    Preconditions: an experts class calling ``NF.router`` and assigning
    ``(selection, logits)``, a statement computing scores from the logits, a
    router weight parameter and its mapping entry, and (when the class calls
    ``NF.moe_block_tkg``) the ``self.fused_decode`` flag.
    """

    ID = "routing-bias"
    REALIZES = Realizes({"moe.routing_bias": to(True)})
    Params = RoutingBiasParams
    PITFALLS = (
        Pitfall(
            340,
            lambda spec, facts: spec.moe is not None and spec.moe.routing_bias,
            "a per-expert routing bias affects selection only, not the weights",
        ),
    )
    EXAMPLES = (
        Example(
            title="selection-only bias (DeepSeek-V3 e_score_correction_bias)",
            before="""
                from vllm_neuron.utils.weight_loader import set_weight_loader


                class Qwen3MoeExperts(nn.Module):
                    def __init__(self, config):
                        self.fused_decode = True
                        self.router_weight = nn.Parameter(torch.empty(self.num_experts, self.hidden_size, dtype=torch.float32))

                    def _setup_weight_loaders(self):
                        set_weight_loader(self.down_proj_weight, expert_down_loader(self.size))

                    def _route(self, hidden_states):
                        selected, router_logits = NF.router(
                            hidden_states,
                            router_weights=self.router_weight.T,
                            top_k=self.num_experts_per_token,
                            return_logits=True,
                        )
                        scores = torch.sigmoid(router_logits)
                        return torch.where(selected != 0, scores, torch.zeros_like(scores))

                    def _run_moe_block_tkg(self, hidden_states):
                        return NF.moe_block_tkg(inp=hidden_states, router_weights=self.router_weight.T)


                class Qwen3MoeForCausalLM(nn.Module):
                    def load_weights(self, path):
                        names = set(checkpoint.get_tensor_names())
                        for layer_id in range(2):
                            prefix = f"model.layers.{layer_id}"
                            mappings[f"{prefix}.mlp.experts.router_weight"] = f"{moe.router}.weight"
            """,
            after='''
                from vllm_neuron.utils.weight_loader import SafetensorsWeightLoader, set_weight_loader


                def _routing_bias_key(names, router: str, block: str, tensor: str) -> str:
                    """Checkpoint key of the per-expert routing bias ``tensor``: under the
                    router module (DeepSeek-V3, GLM-4-MoE), under the router's
                    ``moe_statics`` (ERNIE-4.5-MoE) or under the MoE block (Hunyuan)."""
                    for key in (f"{router}.{tensor}", f"{router}.moe_statics.{tensor}", f"{block}.{tensor}"):
                        if key in names:
                            return key
                    raise KeyError(
                        f"no routing bias in the checkpoint for {block} (looked for {router}.{tensor}, "
                        f"{router}.moe_statics.{tensor}, {block}.{tensor})"
                    )


                def _vector_loader():
                    """Loader of a per-expert vector stored [E] or [1, E]: read whole, flattened to [E]."""

                    def transform(slices, rank):
                        return slices[0][:].reshape(-1)

                    return SafetensorsWeightLoader(transform)


                class Qwen3MoeExperts(nn.Module):
                    def __init__(self, config):
                        self.fused_decode = False
                        self.router_weight = nn.Parameter(torch.empty(self.num_experts, self.hidden_size, dtype=torch.float32))
                        self.routing_bias = nn.Parameter(torch.zeros(self.num_experts, dtype=torch.float32))

                    def _setup_weight_loaders(self):
                        set_weight_loader(self.routing_bias, _vector_loader())
                        set_weight_loader(self.down_proj_weight, expert_down_loader(self.size))

                    def _route(self, hidden_states):
                        selected, router_logits = NF.router(
                            hidden_states,
                            router_weights=self.router_weight.T,
                            top_k=self.num_experts_per_token,
                            return_logits=True,
                        )
                        scores = torch.sigmoid(router_logits)
                        # <-- MODEL-SPECIFIC: the routing bias moves which experts are chosen, not their weights
                        chosen = torch.topk(scores + self.routing_bias, self.num_experts_per_token, dim=-1).indices
                        selected = torch.zeros_like(scores).scatter(-1, chosen, 1.0)
                        return torch.where(selected != 0, scores, torch.zeros_like(scores))

                    def _run_moe_block_tkg(self, hidden_states):
                        return NF.moe_block_tkg(inp=hidden_states, router_weights=self.router_weight.T)


                class Qwen3MoeForCausalLM(nn.Module):
                    def load_weights(self, path):
                        names = set(checkpoint.get_tensor_names())
                        for layer_id in range(2):
                            prefix = f"model.layers.{layer_id}"
                            mappings[f"{prefix}.mlp.experts.router_weight"] = f"{moe.router}.weight"
                            mappings[f"{prefix}.mlp.experts.routing_bias"] = _routing_bias_key(names, moe.router, moe.module, "e_score_correction_bias")
            ''',
        ),
        Example(
            title="a prefill router whose arguments the substitute does not take",
            before="""
                class Qwen3MoeExperts(nn.Module):
                    def __init__(self, config):
                        self.router_weight = nn.Parameter(torch.empty(4, 8, dtype=torch.float32))

                    def _setup_weight_loaders(self):
                        set_weight_loader(self.router_weight, replicated_loader())

                    def forward_prefill(self, x):
                        return NF.router(x, router_weights=self.router_weight.T, top_k=2, gamma=self.norm_weight)
            """,
            raises="NF.router(gamma=...) is not expressed op by op",
        ),
    )

    @classmethod
    def check_params(cls, params: RoutingBiasParams) -> list[str]:
        if not params.checkpoint_name.isidentifier():
            return [f"checkpoint_name {params.checkpoint_name!r} is not a tensor name"]
        return []

    def transform_module(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        found = anatomy_experts.experts_classes(module)
        if not found:
            raise ctx.precondition(
                "routing-bias: no experts class in this file (a <Prefix>Experts class calling NF.router)"
            )
        edits: dict = {}
        router_params: set[str] = set()
        substituted: set[str] = set()
        for survey in found:
            router_params.add(self._parameter(survey, module, ctx, edits))
        by_class = {survey.cls.name.value: survey for survey in found}
        for site in anatomy_experts.moe_sites(module, "moe.router"):
            survey = by_class.get(site.cls)
            if survey is not None and site.call is survey.router_call and len(survey.router_targets) == 2:
                self._route_method(survey, module, ctx, edits)
            elif site.kind in ("router", "block") and not (
                site.kind == "block" and survey is not None and FLAG in survey.assigned
            ):
                self._substitute(site, module, ctx, edits, substituted)
            elif site.kind in ("router_sub", "block_sub"):
                value = parse_expr(f"self.{BIAS}", module)
                edits[id(site.call)] = lambda updated, value=value: set_keyword(
                    updated, "selection_bias", value
                )
            elif site.kind == "block":
                self._unfuse_decode(survey, module, edits)
            else:
                moe_edits.guard_site(
                    module,
                    ctx,
                    site,
                    f"routing bias: {site.name} chooses experts by the scores it weighs them with",
                    "<-- MODEL-SPECIFIC: this router computation cannot apply a selection-only bias",
                    edits,
                )
        module = rewrite(module, edits)
        if substituted:
            module = add_functions(module, moe_edits.substitute_functions(substituted))
        module = add_functions(module, [LOADER_FUNCTION])
        module = ensure_import_from(module, WEIGHT_LOADERS, "SafetensorsWeightLoader")
        return self._mappings(module, router_params, ctx)

    def _parameter(self, survey, module, ctx, edits) -> str:
        """``self.routing_bias`` after the router weight (and bias), and its loader."""
        name = survey.cls.name.value
        router = survey.router_param
        if router is None:
            raise ctx.precondition(
                f"routing-bias: {name} has no router weight parameter "
                "(self.router_weight = nn.Parameter(...) or self.gate_weight)",
                survey.cls,
                module,
            )
        if BIAS in survey.params:
            return router
        anchor = survey.params.get("router_bias") or survey.params[router]
        experts = anatomy_experts.expert_count(survey.params[router])
        new = parse_statement(
            f"self.{BIAS} = nn.Parameter(torch.zeros({experts}, dtype=torch.float32))", module
        )
        edits[id(anchor)] = lambda updated, new=new: cst.FlattenSentinel([updated, new])
        loaders = survey.methods.get("_setup_weight_loaders")
        if loaders is None:
            raise ctx.precondition(
                f"routing-bias: {name} has no _setup_weight_loaders method", survey.cls, module
            )
        # first in the method (after its docstring), so that codemods appending loaders commute
        line = parse_statement(f"set_weight_loader(self.{BIAS}, _vector_loader())", module)
        first = next((st for st in statements(loaders) if not is_docstring(st)), None)
        if first is None:
            raise ctx.precondition(
                f"routing-bias: {name}._setup_weight_loaders has no statement", loaders, module
            )
        edits[id(first)] = lambda updated, line=line: cst.FlattenSentinel([line, updated])
        return router

    def _route_method(self, survey, module, ctx, edits) -> None:
        """A routing method that takes the logits back: choose with the bias after the scores."""
        name = survey.cls.name.value
        if not survey.score_statements:
            raise ctx.precondition(
                f"routing-bias: {name} must compute scores from the router logits it takes back "
                "(scores = torch.sigmoid(logits))",
                survey.router_call,
                module,
            )
        if _chooses_with_bias(survey):
            return
        score_stmt = survey.score_statements[-1]
        scores = code_of(simple_assign(score_stmt)[0])
        selected = survey.router_targets[0]
        top_k = keyword_arg(survey.router_call, "top_k")
        if top_k is None:
            raise ctx.precondition(
                f"routing-bias: the NF.router call of {name} passes no top_k=", survey.router_call, module
            )
        lines = parse_statements(
            f"chosen = torch.topk({scores} + self.{BIAS}, {code_of(top_k.value)}, dim=-1).indices\n"
            f"{selected} = torch.zeros_like({scores}).scatter(-1, chosen, 1.0)\n",
            module,
        )
        lines[0] = lines[0].with_changes(leading_lines=[cst.EmptyLine(comment=cst.Comment(COMMENT))])
        edits[id(score_stmt)] = lambda updated, lines=lines: cst.FlattenSentinel([updated, *lines])

    def _unfuse_decode(self, survey, module, edits) -> None:
        """Decode runs the routing method and the blockwise kernel (``self.fused_decode = False``)."""
        _, value = simple_assign(survey.assigned[FLAG])
        if code_of(value) != "False":
            edits[id(value)] = lambda updated: parse_expr("False", module)

    def _substitute(self, site, module, ctx, edits, substituted) -> None:
        """NF.router and NF.moe_block_tkg choose with the scores they weigh with:
        their op-by-op substitutes take the bias."""
        problems = moe_edits.substitute_problems(site)
        extra = {"selection_bias": parse_expr(f"self.{BIAS}", module)}
        if site.kind == "router":
            norm = anatomy_experts.renormalizes(site)
            if norm is None:
                problems.append(f"whether {site.name} renormalizes its top-k weights is not known")
            else:
                extra["norm_topk_prob"] = parse_expr(str(norm), module)
        else:
            blockwise = moe_edits.blockwise_arguments(module, site.cls)
            if blockwise is None:
                problems.append(
                    f"{site.cls} runs no NF.build_blockwise_mapping and NF.moe_cte (block_size=, moe_group=, "
                    "tp_degree=, implementation=) for the decode substitute to run"
                )
            else:
                extra.update(blockwise)
        if problems:
            if site.kind == "router":
                raise ctx.precondition(
                    f"routing-bias: {site.cls}.{site.function}: {site.name} cannot apply a selection-only bias "
                    "and its op-by-op substitute cannot take this call: " + "; ".join(problems),
                    site.call,
                    module,
                )
            moe_edits.guard_site(
                module,
                ctx,
                site,
                f"routing bias: {site.name} chooses experts by the scores it weighs them with",
                "<-- MODEL-SPECIFIC: this decode kernel cannot apply a selection-only bias",
                edits,
            )
            return
        edits[id(site.call)] = lambda updated, kind=site.kind, extra=extra: moe_edits.to_substitute(
            updated, kind, extra
        )
        substituted.add(site.kind)

    def _mappings(self, module, router_params, ctx) -> cst.Module:
        """The bias's checkpoint key next to the router's: probed among the
        checkpoint's ``names`` when ``load_weights`` has them, else under the
        router module."""
        tensor = self.params.checkpoint_name
        entries = [e for e in mapping_entries(module) if any(e.key.endswith(f".{p}") for p in router_params)]
        if entries and moe_edits.function_assigns(module, entries[0].statement, "names"):
            module = add_functions(module, [KEY_FUNCTION])
            make = lambda router, block: f'_routing_bias_key(names, {router}, {block}, "{tensor}")'  # noqa: E731
        else:
            make = lambda router, block: moe_edits.key_under(router, tensor)  # noqa: E731
        return moe_edits.add_router_mapping_value(
            module,
            ctx,
            router_params,
            BIAS,
            make,
            after=("router_bias",),
        )


def _chooses_with_bias(survey: anatomy_experts.ExpertsSurvey) -> bool:
    """Whether a method other than ``__init__`` already reads ``self.routing_bias``."""
    for method in survey.methods.values():
        if method.name.value == "__init__":
            continue
        for node in walk(method):
            if (
                isinstance(node, cst.Attribute)
                and node.attr.value == BIAS
                and isinstance(node.value, cst.Name)
                and node.value.value == "self"
            ):
                return True
    return False
