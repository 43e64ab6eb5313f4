"""expert-input-scaling: the routed experts read the router-weighted hidden state (Llama 4)."""

from __future__ import annotations

import libcst as cst

from autoport_cst.spec.pitfalls import Pitfall
from autoport_cst.transform import Codemod, Example, FileContext
from autoport_cst.transform.anatomy import experts as anatomy_experts
from autoport_cst.transform.cst.snippets import parse_expr
from autoport_cst.transform.cst.vocabulary import code_of, simple_assign
from autoport_cst.transform.edit import moe as moe_edits
from autoport_cst.transform.edit.arguments import set_keyword
from autoport_cst.transform.edit.functions import add_functions
from autoport_cst.transform.edit.imports import ensure_import_from
from autoport_cst.transform.edit.shared_expert_code import METHOD as SHARED_METHOD
from autoport_cst.transform.edit.tree import rewrite
from autoport_cst.transform.realizes import Realizes, to

MODE = "expert_affinities_scaling_mode"
PRE_SCALE = "ExpertAffinityScaleMode.PRE_SCALE"
ENUM_MODULE = "nkilib.core.utils.common_types"
FLAG = "fused_decode"
# the decode kernel's token-generation MoE asserts that it cannot pre-scale
UNFUSED = "not reached: self.fused_decode = False (NF.moe_block_tkg cannot pre-scale its experts' inputs)"


class ExpertInputScaling(Codemod):
    """Make every routed expert read the token's hidden state multiplied by its router score.

    Llama 4 feeds each routed expert ``x * score`` (the sigmoid of the chosen
    logit) and sums the experts' outputs unweighted; the reference feeds the
    experts ``x`` and weighs their outputs by the scores. The experts are not
    linear (``act(x W_g) * (x W_u)``), so the two differ. Every expert
    computation of the model file (the ``moe.experts`` sites) changes:

    - the blockwise kernel ``NF.moe_cte`` (prefill, the unfused decode, and
      with expert parallelism the same call on the local experts' affinities)
      gets ``expert_affinities_scaling_mode=ExpertAffinityScaleMode.PRE_SCALE``:
      the kernel multiplies each block's rows by their affinities before the
      gate/up projection and accumulates the outputs unweighted;
    - the fused decode kernel ``NF.moe_block_tkg`` cannot pre-scale (its
      token-generation MoE asserts against ``PRE_SCALE``): the experts
      class's ``self.fused_decode`` becomes ``False``, so decode routes with
      the routing method and runs the blockwise kernel above; a class without
      the flag gets the op-by-op substitute ``_moe_block_tkg_unfused`` (the
      same norm and routing, then ``NF.moe_cte``) with ``PRE_SCALE``;
    - a substitute already there (``_moe_block_tkg_unfused``) gets ``PRE_SCALE``;
    - shared experts read the hidden state unscaled and are left as they are;
      any other expert computation (``NF.moe_tkg``, expert modules called in a
      loop) is guarded: its path raises ``NotImplementedError`` naming it.

    Preconditions: an MoE expert site in the file, and ``ExpertAffinityScaleMode``
    importable (it is added to the ``nkilib.core.utils.common_types`` import).
    Already pre-scaling: unchanged.
    """

    ID = "expert-input-scaling"
    REALIZES = Realizes({"moe.expert_input_scaling": to(True)})
    TOUCHES = ("moe.experts",)
    AFTER = ("shared-experts", "routing-bias", "norm-placement")
    PITFALLS = (
        Pitfall(
            347,
            lambda spec, facts: spec.moe is not None and spec.moe.expert_input_scaling,
            "experts read the router-weighted input: the decode kernel NF.moe_block_tkg cannot pre-scale, "
            "decode runs the blockwise kernel",
        ),
    )
    EXAMPLES = (
        Example(
            title="prefill kernel pre-scales; decode leaves the fused kernel for the blockwise one",
            before="""
                from nkilib.core.utils.common_types import ActFnType, ExpertAffinityScaleMode


                class Qwen3MoeExperts(nn.Module):
                    def __init__(self, config):
                        self.fused_decode = True

                    def _experts_blockwise(self, hidden_states, affinities):
                        return NF.moe_cte(
                            hidden_states=hidden_states,
                            expert_affinities_masked=affinities,
                            expert_affinities_scaling_mode=ExpertAffinityScaleMode.POST_SCALE,
                        )

                    def _run_moe_block_tkg(self, hidden_states):
                        return NF.moe_block_tkg(
                            inp=hidden_states,
                            expert_affinities_scaling_mode=ExpertAffinityScaleMode.POST_SCALE,
                        )

                    def forward_decode(self, hidden_states):
                        if self.fused_decode:
                            return self._run_moe_block_tkg(hidden_states)
                        return self._experts_blockwise(hidden_states, self._route(hidden_states))
            """,
            after="""
                from nkilib.core.utils.common_types import ActFnType, ExpertAffinityScaleMode


                class Qwen3MoeExperts(nn.Module):
                    def __init__(self, config):
                        self.fused_decode = False

                    def _experts_blockwise(self, hidden_states, affinities):
                        return NF.moe_cte(
                            hidden_states=hidden_states,
                            expert_affinities_masked=affinities,
                            expert_affinities_scaling_mode=ExpertAffinityScaleMode.PRE_SCALE,
                        )

                    def _run_moe_block_tkg(self, hidden_states):
                        return NF.moe_block_tkg(
                            inp=hidden_states,
                            expert_affinities_scaling_mode=ExpertAffinityScaleMode.POST_SCALE,
                        )

                    def forward_decode(self, hidden_states):
                        if self.fused_decode:
                            return self._run_moe_block_tkg(hidden_states)
                        return self._experts_blockwise(hidden_states, self._route(hidden_states))
            """,
        ),
        Example(
            title="a decode substitute, and an expert loop it cannot pre-scale",
            before="""
                class Qwen3MoeExperts(nn.Module):
                    def forward_decode(self, hidden_states):
                        return _moe_block_tkg_unfused(
                            hidden_states,
                            expert_affinities_scaling_mode=ExpertAffinityScaleMode.POST_SCALE,
                        )

                    def forward_reference(self, hidden_states, weights):
                        out = 0
                        for i in range(4):
                            out = out + self.experts[i](hidden_states) * weights[:, i : i + 1]
                        return out
            """,
            after="""
                from nkilib.core.utils.common_types import ExpertAffinityScaleMode
                class Qwen3MoeExperts(nn.Module):
                    def forward_decode(self, hidden_states):
                        return _moe_block_tkg_unfused(
                            hidden_states,
                            expert_affinities_scaling_mode=ExpertAffinityScaleMode.PRE_SCALE,
                        )

                    def forward_reference(self, hidden_states, weights):
                        out = 0
                        for i in range(4):
                            # <-- MODEL-SPECIFIC: this expert computation does not pre-scale its inputs
                            raise NotImplementedError(
                                "router-weighted expert inputs: self.experts[...] is not ported to them"
                            )
                            out = out + self.experts[i](hidden_states) * weights[:, i : i + 1]
                        return out
            """,
        ),
        Example(
            title="no expert computation",
            before="""
                class LlamaMLP(nn.Module):
                    def forward(self, x):
                        return NF.mlp(x, self.gate_proj_weight, self.up_proj_weight, self.down_proj_weight)
            """,
            raises="no MoE expert computation",
        ),
    )

    def transform_module(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        sites = anatomy_experts.moe_sites(module, "moe.experts")
        if not sites:
            raise ctx.precondition(
                "expert-input-scaling: no MoE expert computation in this file (NF.moe_cte, "
                "NF.moe_block_tkg or an expert module)"
            )
        surveys = {s.cls.name.value: s for s in map(anatomy_experts.survey, _classes(module))}
        edits: dict = {}
        substituted: set[str] = set()
        mode = parse_expr(PRE_SCALE, module)
        for site in sites:
            survey = surveys.get(site.cls)
            if site.kind in ("cte", "block_sub"):
                self._pre_scale(site, mode, edits)
            elif site.kind == "block" and survey is not None and FLAG in survey.assigned:
                self._unfuse(survey, site, module, ctx, edits)
            elif site.kind == "block":
                self._substitute(site, module, ctx, edits, substituted, mode)
            elif _shared_expert(site):
                ctx.unaffected(site.call, "the shared experts read the hidden states unscaled")
            else:
                moe_edits.guard_site(
                    module,
                    ctx,
                    site,
                    f"router-weighted expert inputs: {site.name} is not ported to them",
                    "<-- MODEL-SPECIFIC: this expert computation does not pre-scale its inputs",
                    edits,
                )
        module = rewrite(module, edits)
        if substituted:
            module = add_functions(module, moe_edits.substitute_functions(substituted))
        return ensure_import_from(module, ENUM_MODULE, "ExpertAffinityScaleMode")

    def _pre_scale(self, site, mode, edits) -> None:
        if anatomy_experts.literal(site.call, MODE) != PRE_SCALE:
            edits[id(site.call)] = lambda updated: set_keyword(updated, MODE, mode)

    def _unfuse(self, survey, site, module, ctx, edits) -> None:
        """Decode runs the routing method and the blockwise kernel (``self.fused_decode = False``)."""
        _, value = simple_assign(survey.assigned[FLAG])
        if code_of(value) != "False":
            edits[id(value)] = lambda updated: parse_expr("False", module)
        ctx.unaffected(site.call, UNFUSED)

    def _substitute(self, site, module, ctx, edits, substituted, mode) -> None:
        """A fused decode kernel without the flag: its op-by-op substitute, pre-scaling."""
        problems = [p for p in moe_edits.substitute_problems(site) if "is not POST_SCALE" not in p]
        blockwise = moe_edits.blockwise_arguments(module, site.cls)
        if blockwise is None:
            problems.append(
                f"{site.cls} runs no NF.build_blockwise_mapping and NF.moe_cte (block_size=, moe_group=, "
                "tp_degree=, implementation=) for the decode substitute to run"
            )
        if problems:
            moe_edits.guard_site(
                module,
                ctx,
                site,
                f"router-weighted expert inputs: {site.name} cannot pre-scale its experts' inputs",
                "<-- MODEL-SPECIFIC: this decode kernel cannot pre-scale its experts' inputs",
                edits,
            )
            return
        extra = {**(blockwise or {}), MODE: mode}
        edits[id(site.call)] = lambda updated, extra=extra: moe_edits.to_substitute(updated, "block", extra)
        substituted.add("block")


def _shared_expert(site: anatomy_experts.MoESite) -> bool:
    """A shared expert: the shared-experts codemod's method, or a shared-expert module called."""
    return site.function == SHARED_METHOD or "shared_expert" in site.name


def _classes(module: cst.Module) -> list[cst.ClassDef]:
    return [s for s in module.body if isinstance(s, cst.ClassDef)]
