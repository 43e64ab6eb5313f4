"""routed-scaling: the routed experts' output is multiplied by a constant of the config."""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from autoport_cst.transform import Codemod, Example, FileContext, PortContext
from autoport_cst.transform.anatomy import experts as anatomy_experts
from autoport_cst.transform.cst.snippets import parse_expr, parse_statement
from autoport_cst.transform.cst.vocabulary import code_of, is_call, self_attr, simple_assign, statements, walk
from autoport_cst.transform.edit import moe as moe_edits
from autoport_cst.transform.edit.config_fields import add_config_fields
from autoport_cst.transform.edit.tree import rewrite, with_comment
from autoport_cst.transform.realizes import Realizes, not_to

ID = "routed-scaling"
ATTR = "routed_scaling_factor"
CONFIG_KEYS = ("routed_scaling_factor", "router_scaling_factor")
COMMENT = (
    "<-- MODEL-SPECIFIC: the routed experts' weights are scaled by a constant (after any renormalization)"
)
ANCHORS = ("norm_topk_prob", "num_experts_per_token", "top_k")


@dataclass(frozen=True)
class RoutedScalingParams:
    factor: float = field(
        default=1.0,
        metadata={
            "doc": "The architecture's factor: the config field's default in a config file that has no alias "
            "table (a config spelling the key otherwise still gets it); with the table the default stays 1.0."
        },
    )


class RoutedScaling(Codemod):
    """Multiply the routed experts' weights by ``config.routed_scaling_factor`` (DeepSeek-V3).

    DeepSeek-V3, GLM-4-MoE, Dots1 and Hunyuan scale the top-k weights by a
    constant after choosing (and renormalizing) them; the shared experts are
    not scaled. The factor is read from the config at run time
    (``routed_scaling_factor``, or ``router_scaling_factor``).

    In the experts class (``<Prefix>Experts``, the class calling ``NF.router``):

    - ``__init__``: ``self.routed_scaling_factor = config.routed_scaling_factor``
      after ``self.norm_topk_prob`` (or the top-k setting);
    - the routing method (the one calling ``NF.router``): right before it
      returns the affinities, ``affinities = affinities *
      self.routed_scaling_factor``, after any renormalization (prefill, and
      decode when it does not run the fused kernel);
    - the fused decode kernel ``NF.moe_block_tkg`` has no such factor: its
      output (the routed experts' weighted sum) is multiplied by it right
      after the call.

    Config file: the field ``routed_scaling_factor: float = 1.0`` and its
    config keys in ``_ALIASES``.

    Preconditions: an experts class calling ``NF.router`` whose ``__init__``
    sets one of ``self.norm_topk_prob`` / ``self.num_experts_per_token``, whose
    routing method ends in ``return <name>``, and whose fused kernel call (if
    any) is assigned to a name.
    """

    ID = ID
    REALIZES = Realizes({"moe.routed_scaling_factor": not_to(None)})
    Params = RoutedScalingParams
    FILES = ("model", "config")
    EXAMPLES = (
        Example(
            title="routed weights scaled in the routing method and after the fused decode kernel",
            before="""
                class Qwen3MoeExperts(nn.Module):
                    def __init__(self, config):
                        self.num_experts_per_token = config.num_experts_per_tok
                        self.norm_topk_prob = config.norm_topk_prob

                    def _route(self, hidden_states):
                        selected, router_logits = NF.router(
                            hidden_states, router_weights=self.router_weight.T, top_k=2, return_logits=True
                        )
                        scores = torch.sigmoid(router_logits)
                        affinities = torch.where(selected != 0, scores, torch.zeros_like(scores))
                        if self.norm_topk_prob:
                            affinities = affinities / affinities.sum(dim=-1, keepdim=True)
                        return affinities

                    def _run_moe_block_tkg(self, hidden_states):
                        output = NF.moe_block_tkg(inp=hidden_states.unsqueeze(0), top_k=2)
                        return output.view(-1, self.hidden_size)
            """,
            after="""
                class Qwen3MoeExperts(nn.Module):
                    def __init__(self, config):
                        self.num_experts_per_token = config.num_experts_per_tok
                        self.norm_topk_prob = config.norm_topk_prob
                        # <-- MODEL-SPECIFIC: the routed experts' weights are scaled by a constant (after any renormalization)
                        self.routed_scaling_factor = config.routed_scaling_factor

                    def _route(self, hidden_states):
                        selected, router_logits = NF.router(
                            hidden_states, router_weights=self.router_weight.T, top_k=2, return_logits=True
                        )
                        scores = torch.sigmoid(router_logits)
                        affinities = torch.where(selected != 0, scores, torch.zeros_like(scores))
                        if self.norm_topk_prob:
                            affinities = affinities / affinities.sum(dim=-1, keepdim=True)
                        affinities = affinities * self.routed_scaling_factor
                        return affinities

                    def _run_moe_block_tkg(self, hidden_states):
                        output = NF.moe_block_tkg(inp=hidden_states.unsqueeze(0), top_k=2)
                        output = output * self.routed_scaling_factor
                        return output.view(-1, self.hidden_size)
            """,
        ),
        Example(
            title="config: the factor and its config keys",
            role="config",
            path="config.py",
            before="""
                _ALIASES = {
                    "num_experts": ("num_experts", "n_routed_experts"),
                }


                @dataclass
                class Qwen3MoeConfig:
                    num_experts: int = 128
                    torch_dtype: torch.dtype = torch.bfloat16
            """,
            after="""
                _ALIASES = {
                    "num_experts": ("num_experts", "n_routed_experts"),
                    "routed_scaling_factor": ("routed_scaling_factor", "router_scaling_factor"),
                }


                @dataclass
                class Qwen3MoeConfig:
                    num_experts: int = 128
                    # <-- MODEL-SPECIFIC: fields of this architecture's features (sorted by name)
                    routed_scaling_factor: float = 1.0
                    torch_dtype: torch.dtype = torch.bfloat16
            """,
        ),
        Example(
            title="a routing method that does not return a name",
            before="""
                class MixtralExperts(nn.Module):
                    def __init__(self, config):
                        self.num_experts_per_token = config.num_experts_per_tok

                    def _route(self, x):
                        return NF.router(x, router_weights=self.router_weight.T, top_k=2)
            """,
            raises="must end in return <name>",
        ),
    )

    @classmethod
    def params_for(cls, diffs, target, port: PortContext) -> RoutedScalingParams:
        return RoutedScalingParams(factor=float(target.moe.routed_scaling_factor))

    def transform_module(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        if ctx.role == "config":
            if not moe_edits.has_config_aliases(module):
                return add_config_fields(module, ctx, [(f"{ATTR}: float = {self.params.factor!r}", "")])
            module = moe_edits.add_config_alias(module, ctx, ATTR, CONFIG_KEYS)
            return add_config_fields(module, ctx, [(f"{ATTR}: float = 1.0", "")])
        found = anatomy_experts.experts_classes(module)
        if not found:
            raise ctx.precondition(
                "routed-scaling: no experts class in this file (a <Prefix>Experts class calling NF.router)"
            )
        edits: dict = {}
        for survey in found:
            name = survey.cls.name.value
            init = survey.methods.get("__init__")
            if init is None:
                raise ctx.precondition(f"routed-scaling: {name} has no __init__", survey.cls, module)
            config = anatomy_experts.method_parameter(init, 0) or "config"
            if ATTR not in survey.assigned:
                anchor = next((survey.assigned[a] for a in ANCHORS if a in survey.assigned), None)
                if anchor is None:
                    raise ctx.precondition(
                        f"routed-scaling: {name}.__init__ sets none of "
                        + ", ".join(f"self.{a}" for a in ANCHORS),
                        init,
                        module,
                    )
                line = with_comment(parse_statement(f"self.{ATTR} = {config}.{ATTR}", module), COMMENT)
                edits[id(anchor)] = lambda updated, line=line: cst.FlattenSentinel([updated, line])
            self._scale_route(survey, module, ctx, edits)
            self._scale_kernel(survey, module, ctx, edits)
        self._guard_others(module, ctx, edits)
        return rewrite(module, edits)

    def _scale_route(self, survey, module, ctx, edits) -> None:
        if len(survey.router_targets) == 1 and survey.router_statement is not None:
            # x = NF.router(...): the kernel (or its substitute) returns the final weights
            out = survey.router_targets[0]
            line = parse_statement(f"{out} = {out} * self.{ATTR}", module)
            statement = survey.router_statement
            if not _scaled_after(survey.cls, statement, out):
                edits[id(statement)] = lambda updated, line=line: cst.FlattenSentinel([updated, line])
            return
        route = next(
            (m for m in survey.methods.values() if any(n is survey.router_call for n in walk(m))), None
        )
        body = list(statements(route)) if route is not None else []
        last = body[-1] if body else None
        returned = None
        if (
            isinstance(last, cst.SimpleStatementLine)
            and isinstance(last.body[0], cst.Return)
            and isinstance(last.body[0].value, cst.Name)
        ):
            returned = last.body[0].value.value
        if returned is None:
            raise ctx.precondition(
                f"routed-scaling: the routing method of {survey.cls.name.value} (the one calling NF.router) "
                "must end in return <name> (the affinities)",
                route or survey.router_call,
                module,
            )
        if len(body) > 1 and _scales(body[-2], returned):
            return
        line = parse_statement(f"{returned} = {returned} * self.{ATTR}", module)
        edits[id(last)] = lambda updated, line=line: cst.FlattenSentinel([line, updated])

    def _scale_kernel(self, survey, module, ctx, edits) -> None:
        """The fused decode kernel weighs the experts itself: its output is scaled."""
        kernels = (anatomy_experts.DECODE_KERNEL, anatomy_experts.BLOCK_SUBSTITUTE)
        for method in survey.methods.values():
            body = list(statements(method))
            for index, stmt in enumerate(body):
                calls = [n for n in walk(stmt) if isinstance(n, cst.Call) and is_call(n, *kernels)]
                if not calls:
                    continue
                if _returns_scaled(stmt):
                    continue
                if (
                    isinstance(stmt, cst.SimpleStatementLine)
                    and isinstance(stmt.body[0], cst.Return)
                    and stmt.body[0].value is calls[0]
                ):
                    if (anatomy_experts.literal(calls[0], "skip_router_logits") or "False") != "True":
                        raise ctx.precondition(
                            f"routed-scaling: the decode kernel of {survey.cls.name.value} returns its router "
                            "logits too (skip_router_logits is not True)",
                            stmt,
                            module,
                        )
                    ret = stmt.body[0]
                    new = parse_expr(f"{code_of(calls[0])} * self.{ATTR}", module)
                    edits[id(ret)] = lambda updated, new=new: updated.with_changes(value=new)
                    continue
                pair = simple_assign(stmt) if isinstance(stmt, cst.SimpleStatementLine) else None
                if pair is None or not isinstance(pair[0], cst.Name):
                    raise ctx.precondition(
                        f"routed-scaling: the NF.moe_block_tkg call of {survey.cls.name.value} is not assigned "
                        "to a name (output = NF.moe_block_tkg(...)) nor returned",
                        stmt,
                        module,
                    )
                out = pair[0].value
                if index + 1 < len(body) and _scales(body[index + 1], out):
                    continue
                line = parse_statement(f"{out} = {out} * self.{ATTR}", module)
                edits[id(stmt)] = lambda updated, line=line: cst.FlattenSentinel([updated, line])

    def _guard_others(self, module, ctx, edits) -> None:
        """Router kernels whose weights feed experts elsewhere (an all-to-all decode) are guarded."""
        for site in anatomy_experts.moe_sites(module, "moe.router"):
            if site.kind == "other":
                moe_edits.guard_site(
                    module,
                    ctx,
                    site,
                    f"routed scaling factor: {site.name} is not ported to it",
                    "<-- MODEL-SPECIFIC: the weights of this router kernel are not scaled",
                    edits,
                )


def _returns_scaled(stmt: cst.CSTNode) -> bool:
    """``return <kernel>(...) * self.routed_scaling_factor``."""
    return (
        isinstance(stmt, cst.SimpleStatementLine)
        and isinstance(stmt.body[0], cst.Return)
        and isinstance(stmt.body[0].value, cst.BinaryOperation)
        and self_attr(stmt.body[0].value.right) == ATTR
    )


def _scaled_after(cls: cst.ClassDef, statement: cst.CSTNode, name: str) -> bool:
    """Whether the statement after ``statement`` (in its block) scales ``name``."""
    for node in walk(cls):
        body = getattr(node, "body", None)
        if isinstance(body, (list, tuple)) and any(s is statement for s in body):
            index = next(i for i, s in enumerate(body) if s is statement)
            return index + 1 < len(body) and _scales(body[index + 1], name)
    return False


def _scales(stmt: cst.CSTNode, name: str) -> bool:
    """``name = name * self.routed_scaling_factor``."""
    pair = simple_assign(stmt) if isinstance(stmt, cst.SimpleStatementLine) else None
    return (
        pair is not None
        and code_of(pair[0]) == name
        and isinstance(pair[1], cst.BinaryOperation)
        and self_attr(pair[1].right) == ATTR
    )
