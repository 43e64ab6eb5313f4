"""router-activation: the MoE router scores experts with a softmax or a sigmoid."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import libcst as cst

from autoport_cst.transform import Codemod, Example, FileContext, PortContext
from autoport_cst.transform import moe as moe_edits
from autoport_cst.transform.arguments import set_keyword
from autoport_cst.transform.cst_helpers import (
    code_of,
    keyword_arg,
    parse_expr,
    rewrite,
    simple_assign,
)

KERNEL_ENUM = {"softmax": "RouterActFnType.SOFTMAX", "sigmoid": "RouterActFnType.SIGMOID"}


@dataclass(frozen=True)
class RouterActivationParams:
    activation: Literal["softmax", "sigmoid"] = field(
        default="sigmoid", metadata={"doc": "Score function of the router."}
    )


class RouterActivation(Codemod):
    """Make the MoE router score experts with a softmax or a sigmoid.

    In the experts class (``<Prefix>Experts``, the class that calls
    ``NF.router``):

    - ``NF.router(..., activation=...)`` gets the activation (the kernel picks
      the top k by logit, which is the same choice for both functions);
    - when the routing method takes the logits back
      (``selected, logits = NF.router(..., return_logits=True)``), the
      statement that turns them into scores
      (``scores = torch.softmax(logits, dim=-1)``) becomes
      ``torch.sigmoid(logits)`` or the reverse: the top-k weights are then
      each chosen expert's own sigmoid (renormalized only when the model's
      ``norm_topk_prob`` says so) instead of its softmax probability;
    - the fused decode kernel ``NF.moe_block_tkg`` gets
      ``router_act_fn=RouterActFnType.SIGMOID`` (or ``SOFTMAX``), when the
      class calls it.

    Precondition: an experts class that calls ``NF.router``. Already using the
    activation: unchanged.
    """

    ID = "router-activation"
    REALIZES = ("moe.router_activation",)
    Params = RouterActivationParams
    EXAMPLES = (
        Example(
            title="softmax router to sigmoid (DeepSeek-V3-style scores)",
            params={"activation": "sigmoid"},
            before="""
                class Qwen3MoeExperts(nn.Module):
                    def _route(self, hidden_states):
                        selected, router_logits = NF.router(
                            hidden_states,
                            router_weights=self.router_weight.T,
                            top_k=self.num_experts_per_token,
                            activation="softmax",
                            return_logits=True,
                        )
                        scores = torch.softmax(router_logits, dim=-1)
                        return torch.where(selected != 0, scores, torch.zeros_like(scores))

                    def _run_moe_block_tkg(self, hidden_states):
                        return NF.moe_block_tkg(inp=hidden_states, router_act_fn=RouterActFnType.SOFTMAX)
            """,
            after="""
                class Qwen3MoeExperts(nn.Module):
                    def _route(self, hidden_states):
                        selected, router_logits = NF.router(
                            hidden_states,
                            router_weights=self.router_weight.T,
                            top_k=self.num_experts_per_token,
                            activation="sigmoid",
                            return_logits=True,
                        )
                        scores = torch.sigmoid(router_logits)
                        return torch.where(selected != 0, scores, torch.zeros_like(scores))

                    def _run_moe_block_tkg(self, hidden_states):
                        return NF.moe_block_tkg(inp=hidden_states, router_act_fn=RouterActFnType.SIGMOID)
            """,
        ),
        Example(
            title="router without an activation argument, back to softmax",
            params={"activation": "softmax"},
            before="""
                class MixtralExperts(nn.Module):
                    def forward(self, x):
                        affinities = NF.router(x, router_weights=self.router_weight.T, top_k=2)
                        return affinities
            """,
            after="""
                class MixtralExperts(nn.Module):
                    def forward(self, x):
                        affinities = NF.router(x, router_weights=self.router_weight.T, top_k=2, activation="softmax")
                        return affinities
            """,
        ),
        Example(
            title="no router",
            before="""
                class LlamaMLP(nn.Module):
                    def forward(self, x):
                        return NF.mlp(x, self.gate_proj_weight, self.up_proj_weight, self.down_proj_weight)
            """,
            raises="no experts class",
        ),
    )

    @classmethod
    def params_for(cls, diffs, target, port: PortContext) -> RouterActivationParams:
        return RouterActivationParams(activation=target.moe.router_activation)

    def transform_module(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        found = moe_edits.experts_classes(module)
        if not found:
            raise ctx.precondition(
                "router-activation: no experts class in this file (a <Prefix>Experts class "
                "calling NF.router)"
            )
        activation = self.params.activation
        string = parse_expr(f'"{activation}"', module)
        kernel_enum = parse_expr(KERNEL_ENUM[activation], module)
        logits = None
        edits: dict = {}
        for survey in found:
            call = survey.router_call
            current = keyword_arg(call, "activation")
            if current is None or code_of(current.value).strip("\"'") != activation:
                edits[id(call)] = lambda updated: set_keyword(updated, "activation", string)
            if len(survey.router_targets) == 2:
                logits = survey.router_targets[1]
                score = (
                    f"torch.sigmoid({logits})" if activation == "sigmoid" else f"torch.softmax({logits}, dim=-1)"
                )
                for stmt in survey.score_statements:
                    _, value = simple_assign(stmt)
                    if code_of(value) != score:
                        edits[id(value)] = lambda updated, score=score: parse_expr(score, module)
            for kernel in moe_edits.calls_named(survey, moe_edits.DECODE_KERNEL):
                arg = keyword_arg(kernel, "router_act_fn")
                if arg is None or code_of(arg.value) != KERNEL_ENUM[activation]:
                    edits[id(kernel)] = lambda updated: set_keyword(updated, "router_act_fn", kernel_enum)
        return rewrite(module, edits)
