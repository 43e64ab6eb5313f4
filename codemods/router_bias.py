"""router-bias: the MoE router projection gets a learned bias (GPT-OSS)."""

from __future__ import annotations

import libcst as cst

from autoport_cst.spec.pitfalls import Pitfall
from autoport_cst.transform import Codemod, Example, FileContext
from autoport_cst.transform.anatomy import experts as anatomy_experts
from autoport_cst.transform.cst.snippets import parse_expr, parse_statement
from autoport_cst.transform.cst.vocabulary import is_none, keyword_arg
from autoport_cst.transform.edit import moe as moe_edits
from autoport_cst.transform.edit.arguments import set_keyword
from autoport_cst.transform.edit.tree import rewrite
from autoport_cst.transform.realizes import Realizes, to

BIAS = "router_bias"


class RouterBias(Codemod):
    """Give the MoE router projection a learned bias: ``logits = x W + b``.

    The bias moves both which experts are chosen and their weights (unlike a
    routing bias, which only moves the choice; see ``routing-bias``). In the
    experts class (``<Prefix>Experts``, the class that calls ``NF.router``):

    - ``__init__``: ``self.router_bias = nn.Parameter(torch.zeros(E,
      dtype=torch.float32))`` right after the router weight, with the router
      weight's expert count; replicated on every rank like the weight;
    - ``NF.router(..., router_bias=self.router_bias)`` (the op takes ``[E]``);
    - the fused decode kernel ``NF.moe_block_tkg`` gets
      ``router_bias=self.router_bias.unsqueeze(0)`` (it takes ``[1, E]``);
    - the op-by-op substitutes (``_moe_router``, ``_moe_block_tkg_unfused``)
      likewise; any other router site (a fused router-top-k kernel, an
      explicit matmul) is guarded: its path raises ``NotImplementedError``.

    Every router site of every model file is edited (the prefill router and
    the router fused into the decode kernel alike). The bias is float32 and
    loaded whole on every rank, like the replicated router weight.

    In ``load_weights`` the mapping gains ``...router_bias`` next to the
    router weight's entry, with the checkpoint key's ``.weight`` replaced by
    ``.bias``.

    Preconditions: an experts class calling ``NF.router`` with a
    ``self.router_weight`` (or ``gate_weight``) parameter, and its mapping
    entry. Parts already present are left as they are.
    """

    ID = "router-bias"
    REALIZES = Realizes({"moe.router_bias": to(True)})
    PITFALLS = (
        Pitfall(
            330,
            lambda spec, facts: spec.moe is not None and spec.moe.router_bias,
            "router projection has a bias",
        ),
    )
    EXAMPLES = (
        Example(
            title="GPT-OSS-style router bias",
            before="""
                class Qwen3MoeExperts(nn.Module):
                    def __init__(self, config):
                        self.router_weight = nn.Parameter(torch.empty(self.num_experts, self.hidden_size, dtype=torch.float32))

                    def _route(self, hidden_states):
                        return NF.router(hidden_states, router_weights=self.router_weight.T, top_k=2, router_bias=None)

                    def _run_moe_block_tkg(self, hidden_states):
                        return NF.moe_block_tkg(
                            inp=hidden_states,
                            router_weights=self.router_weight.T,
                            top_k=2,
                        )


                class Qwen3MoeForCausalLM(nn.Module):
                    def load_weights(self, path):
                        for layer_id in range(2):
                            prefix = f"model.layers.{layer_id}"
                            mappings[f"{prefix}.mlp.experts.router_weight"] = f"{moe.router}.weight"
            """,
            after="""
                class Qwen3MoeExperts(nn.Module):
                    def __init__(self, config):
                        self.router_weight = nn.Parameter(torch.empty(self.num_experts, self.hidden_size, dtype=torch.float32))
                        self.router_bias = nn.Parameter(torch.zeros(self.num_experts, dtype=torch.float32))

                    def _route(self, hidden_states):
                        return NF.router(hidden_states, router_weights=self.router_weight.T, top_k=2, router_bias=self.router_bias)

                    def _run_moe_block_tkg(self, hidden_states):
                        return NF.moe_block_tkg(
                            inp=hidden_states,
                            router_weights=self.router_weight.T,
                            top_k=2,
                            router_bias=self.router_bias.unsqueeze(0),
                        )


                class Qwen3MoeForCausalLM(nn.Module):
                    def load_weights(self, path):
                        for layer_id in range(2):
                            prefix = f"model.layers.{layer_id}"
                            mappings[f"{prefix}.mlp.experts.router_weight"] = f"{moe.router}.weight"
                            mappings[f"{prefix}.mlp.experts.router_bias"] = f"{moe.router}.bias"
            """,
        ),
        Example(
            title="no router weight parameter",
            before="""
                class Qwen3MoeExperts(nn.Module):
                    def _route(self, hidden_states):
                        return NF.router(hidden_states, router_weights=self.w.T, top_k=2)
            """,
            raises="no router weight",
        ),
    )

    def transform_module(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        found = anatomy_experts.experts_classes(module)
        if not found:
            raise ctx.precondition(
                "router-bias: no experts class in this file (a <Prefix>Experts class calling NF.router)"
            )
        edits: dict = {}
        router_params: set[str] = set()
        for survey in found:
            router = survey.router_param
            if router is None:
                raise ctx.precondition(
                    f"router-bias: {survey.cls.name.value} has no router weight parameter "
                    "(self.router_weight = nn.Parameter(...) or self.gate_weight)",
                    survey.cls,
                    module,
                )
            router_params.add(router)
            if BIAS not in survey.params:
                statement = survey.params[router]
                experts = anatomy_experts.expert_count(statement)
                new = parse_statement(
                    f"self.{BIAS} = nn.Parameter(torch.zeros({experts}, dtype=torch.float32))", module
                )
                edits[id(statement)] = lambda updated, new=new: cst.FlattenSentinel([updated, new])
        self._sites(module, ctx, edits)
        module = rewrite(module, edits)
        return moe_edits.add_router_mapping(module, ctx, router_params, BIAS, ".bias")

    def _sites(self, module, ctx, edits) -> None:
        """Every router site adds the bias to its logits: ``[E]`` for NF.router,
        ``[1, E]`` for the fused decode kernels."""
        for site in anatomy_experts.moe_sites(module, "moe.router"):
            if site.kind in ("router", "router_sub"):
                value = parse_expr(f"self.{BIAS}", module)
            elif site.kind in ("block", "block_sub"):
                value = parse_expr(f"self.{BIAS}.unsqueeze(0)", module)
            else:
                moe_edits.guard_site(
                    module,
                    ctx,
                    site,
                    f"router bias: {site.name} is not ported to a router bias",
                    "<-- MODEL-SPECIFIC: this router computation does not take the router bias",
                    edits,
                )
                continue
            arg = keyword_arg(site.call, "router_bias")
            if arg is None or is_none(arg.value):
                edits[id(site.call)] = lambda updated, value=value: set_keyword(updated, "router_bias", value)
