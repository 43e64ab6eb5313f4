"""router-activation: the MoE router scores experts with a softmax or a sigmoid."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import libcst as cst

from autoport_cst.transform import Codemod, Example, FileContext, PortContext
from autoport_cst.transform.anatomy import experts as anatomy_experts
from autoport_cst.transform.cst.snippets import parse_expr
from autoport_cst.transform.cst.vocabulary import code_of, simple_assign, walk
from autoport_cst.transform.edit import moe as moe_edits
from autoport_cst.transform.edit.arguments import set_keyword
from autoport_cst.transform.edit.functions import add_functions
from autoport_cst.transform.edit.tree import rewrite

KERNEL_ENUM = {"softmax": "RouterActFnType.SOFTMAX", "sigmoid": "RouterActFnType.SIGMOID"}


@dataclass(frozen=True)
class RouterActivationParams:
    activation: Literal["softmax", "sigmoid"] = field(
        default="sigmoid", metadata={"doc": "Score function of the router."}
    )


class RouterActivation(Codemod):
    """Make the MoE router score experts with a softmax or a sigmoid, on every router site.

    Every router computation of every model file changes (the ``moe.router``
    sites: the prefill router, the router fused into the decode kernel), and
    each keeps whether it renormalizes the chosen experts' weights (the
    reference's ``norm_topk_prob``):

    - ``NF.router(..., activation=...)``: the kernel picks the top k by logit
      (the same choice for both functions) and activates the chosen logits, so
      a softmax renormalizes and a sigmoid does not. When the new activation
      would change that (the real packages' softmax router, always
      renormalized, made a sigmoid), the call becomes the op-by-op
      ``_moe_router(..., activation=..., norm_topk_prob=<as before>)``
      (added to the model file with ``_moe_topk_affinities``);
    - a routing method that takes the logits back
      (``selected, logits = NF.router(..., return_logits=True)``) and turns
      them into scores (``scores = torch.softmax(logits, dim=-1)``): that
      statement becomes ``torch.sigmoid(logits)`` or the reverse, each chosen
      expert keeping its own score (renormalized where the method reads
      ``norm_topk_prob``);
    - the fused decode kernel ``NF.moe_block_tkg`` (and its op-by-op
      substitute) gets ``router_act_fn=RouterActFnType.SIGMOID`` (or
      ``SOFTMAX``); where that would change its renormalization (a softmax
      after the top-k, ``router_pre_norm=False``, renormalizes by itself) it
      gets ``norm_topk_prob=True`` or ``router_pre_norm=True`` to keep it;
    - a router written out without a kernel (``logits = x @
      self.router_weight.T``, the latent reference's): its scores statement
      becomes ``torch.softmax(logits, dim=-1)`` or ``torch.sigmoid(logits)``;
    - other router kernels (``NF.rmsnorm_router_topk_tkg`` of an all-to-all
      decode, explicit router matmuls) are guarded: their path raises
      ``NotImplementedError`` naming the activation.

    Preconditions: a router site in the file; ``RouterActFnType`` imported
    where a decode kernel is edited; an ``NF.router`` call that can be
    substituted when its normalization would change (its arguments are named
    in the refusal). Already using the activation: unchanged.
    """

    ID = "router-activation"
    REALIZES = ("moe.router_activation",)
    Params = RouterActivationParams
    EXAMPLES = (
        Example(
            title="softmax router to sigmoid (DeepSeek-V3-style scores)",
            params={"activation": "sigmoid"},
            before="""
                from nkilib.core.utils.common_types import RouterActFnType


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
                from nkilib.core.utils.common_types import RouterActFnType


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
            title="real shape: prefill router substitute, decode kernel renormalizing after a softmax, all-to-all router",
            params={"activation": "sigmoid"},
            before="""
                from nkilib.core.utils.common_types import RouterActFnType


                class Qwen3MoeExperts(nn.Module):
                    def _run_moe_block_tkg(self, hidden_states):
                        return NF.moe_block_tkg(
                            inp=hidden_states.unsqueeze(0),
                            router_weights=self.router_weight.T,
                            router_act_fn=RouterActFnType.SOFTMAX,
                            router_pre_norm=False,
                        )

                    def forward_decode(self, hidden_states):
                        if self.use_all2all:
                            normed, index, weights = NF.rmsnorm_router_topk_tkg(hidden_states, router_weights=self.router_weight.T)
                        return self._run_moe_block_tkg(hidden_states)

                    def forward_prefill(self, hidden_states):
                        expert_affinities = _moe_router(
                            hidden_states=hidden_states,
                            router_weights=self.router_weight.T,
                            top_k=self.num_experts_per_token,
                            activation="softmax",
                            norm_topk_prob=True,
                        )
                        return expert_affinities
            """,
            after="""
                from nkilib.core.utils.common_types import RouterActFnType


                class Qwen3MoeExperts(nn.Module):
                    def _run_moe_block_tkg(self, hidden_states):
                        return NF.moe_block_tkg(
                            inp=hidden_states.unsqueeze(0),
                            router_weights=self.router_weight.T,
                            router_act_fn=RouterActFnType.SIGMOID,
                            router_pre_norm=False,
                            norm_topk_prob=True,
                        )

                    def forward_decode(self, hidden_states):
                        if self.use_all2all:
                            # <-- MODEL-SPECIFIC: this router kernel cannot take the model's activation
                            raise NotImplementedError(
                                "sigmoid router: NF.rmsnorm_router_topk_tkg is not ported to it"
                            )
                            normed, index, weights = NF.rmsnorm_router_topk_tkg(hidden_states, router_weights=self.router_weight.T)
                        return self._run_moe_block_tkg(hidden_states)

                    def forward_prefill(self, hidden_states):
                        expert_affinities = _moe_router(
                            hidden_states=hidden_states,
                            router_weights=self.router_weight.T,
                            top_k=self.num_experts_per_token,
                            activation="sigmoid",
                            norm_topk_prob=True,
                        )
                        return expert_affinities
            """,
        ),
        Example(
            title="a router written as a matmul with the router weight (the latent reference's) to softmax",
            params={"activation": "softmax"},
            before="""
                class DeepseekV3MoE(nn.Module):
                    def _route(self, hidden_states):
                        logits = hidden_states.to(torch.float32) @ self.router_weight.T
                        scores = torch.sigmoid(logits)
                        return scores.topk(2, dim=-1).indices
            """,
            after="""
                class DeepseekV3MoE(nn.Module):
                    def _route(self, hidden_states):
                        logits = hidden_states.to(torch.float32) @ self.router_weight.T
                        scores = torch.softmax(logits, dim=-1)
                        return scores.topk(2, dim=-1).indices
            """,
        ),
        Example(
            title="no router",
            before="""
                class LlamaMLP(nn.Module):
                    def forward(self, x):
                        return NF.mlp(x, self.gate_proj_weight, self.up_proj_weight, self.down_proj_weight)
            """,
            raises="no MoE router",
        ),
    )

    @classmethod
    def params_for(cls, diffs, target, port: PortContext) -> RouterActivationParams:
        return RouterActivationParams(activation=target.moe.router_activation)

    def transform_module(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        sites = anatomy_experts.moe_sites(module, "moe.router")
        if not sites and _matmul_scores(module):
            return self._matmul_router(module)
        if not sites:
            raise ctx.precondition(
                "router-activation: no MoE router in this file (NF.router, NF.moe_block_tkg, "
                "or a <Prefix>Experts class calling NF.router)"
            )
        activation = self.params.activation
        edits: dict = {}
        substituted: set[str] = set()
        for site in sites:
            if site.kind in ("router", "router_sub"):
                self._router(site, module, ctx, edits, substituted)
            elif site.kind in ("block", "block_sub"):
                self._block(site, module, ctx, edits)
            else:
                moe_edits.guard_site(
                    module,
                    ctx,
                    site,
                    f"{activation} router: {site.name} is not ported to it",
                    "<-- MODEL-SPECIFIC: this router kernel cannot take the model's activation",
                    edits,
                )
        self._scores(module, edits)
        module = rewrite(module, edits)
        if substituted:
            module = add_functions(module, moe_edits.substitute_functions(substituted))
        return module

    def _router(self, site, module, ctx, edits, substituted) -> None:
        activation = self.params.activation
        string = parse_expr(f'"{activation}"', module)
        before = anatomy_experts.renormalizes(site)
        if site.kind == "router" and before is not None and before != (activation == "softmax"):
            problems = moe_edits.substitute_problems(site)
            if problems:
                raise ctx.precondition(
                    f"router-activation: {site.cls}.{site.function}: a {activation} NF.router would "
                    f"{'stop' if before else 'start'} renormalizing the chosen experts' weights, and its "
                    "op-by-op substitute cannot take this call: " + "; ".join(problems),
                    site.call,
                    module,
                )
            norm = parse_expr(str(before), module)
            edits[id(site.call)] = lambda updated, norm=norm: moe_edits.to_substitute(
                updated, "router", {"activation": string, "norm_topk_prob": norm}
            )
            substituted.add("router")
            return
        if anatomy_experts.activation_of(site) != activation:
            edits[id(site.call)] = lambda updated: set_keyword(updated, "activation", string)

    def _block(self, site, module, ctx, edits) -> None:
        activation = self.params.activation
        if anatomy_experts.activation_of(site) == activation:
            return
        if not moe_edits.module_imports_name(module, "RouterActFnType"):
            raise ctx.precondition(
                f"router-activation: {site.name} is called in a file that does not import RouterActFnType",
                site.call,
                module,
            )
        before = anatomy_experts.renormalizes(site)
        pre_norm = anatomy_experts.literal(site.call, "router_pre_norm")
        if before is None and pre_norm not in (None, "True"):
            raise ctx.precondition(
                f"router-activation: {site.cls}.{site.function}: {site.name}(router_pre_norm={pre_norm}) is "
                "read at run time, so whether a new activation keeps the top-k renormalization is not known",
                site.call,
                module,
            )
        after_softmax_renorm = pre_norm == "False" and activation == "softmax"
        changes: list[tuple[str, str]] = [("router_act_fn", KERNEL_ENUM[activation])]
        if (
            before is True
            and not after_softmax_renorm
            and anatomy_experts.literal(site.call, "norm_topk_prob") != "True"
        ):
            changes.append(("norm_topk_prob", "True"))
        elif before is False and after_softmax_renorm:
            changes.append(("router_pre_norm", "True"))

        def edit(updated, changes=changes):
            for key, value in changes:
                updated = set_keyword(updated, key, parse_expr(value, module))
            return updated

        edits[id(site.call)] = edit

    def _matmul_router(self, module: cst.Module) -> cst.Module:
        """A router written out (``logits = x @ self.router_weight.T``, the
        latent reference's): its scores statement takes the activation."""
        edits: dict = {}
        for value, logits in _matmul_scores(module):
            score = _score_expr(self.params.activation, logits)
            if code_of(value) != score:
                edits[id(value)] = lambda updated, score=score: parse_expr(score, module)
        return rewrite(module, edits)

    def _scores(self, module, edits) -> None:
        """Routing methods that take the logits back: the scores statement."""
        activation = self.params.activation
        for survey in anatomy_experts.experts_classes(module):
            if len(survey.router_targets) != 2:
                continue
            logits = survey.router_targets[1]
            score = (
                f"torch.sigmoid({logits})" if activation == "sigmoid" else f"torch.softmax({logits}, dim=-1)"
            )
            for stmt in survey.score_statements:
                _, value = simple_assign(stmt)
                if code_of(value) != score:
                    edits[id(value)] = lambda updated, score=score: parse_expr(score, module)


def _score_expr(activation: str, logits: str) -> str:
    return f"torch.sigmoid({logits})" if activation == "sigmoid" else f"torch.softmax({logits}, dim=-1)"


def _matmul_scores(module: cst.Module) -> list[tuple[cst.BaseExpression, str]]:
    """(value, logits name) of every ``scores = torch.sigmoid(logits)`` /
    ``torch.softmax(logits, dim=-1)`` in a method where ``logits`` is a
    matmul with ``self.router_weight``."""
    found = []
    for func in (n for n in walk(module) if isinstance(n, cst.FunctionDef)):
        logits: list[str] = []
        for stmt in walk(func):
            assigned = simple_assign(stmt)
            if assigned is None or not isinstance(assigned[0], cst.Name):
                continue
            target, value = assigned
            text = code_of(value)
            if isinstance(value, cst.BinaryOperation) and "self.router_weight" in text and "@" in text:
                logits.append(target.value)
                continue
            found += [
                (value, name)
                for name in logits
                if text in (_score_expr("sigmoid", name), _score_expr("softmax", name))
            ]
    return found
