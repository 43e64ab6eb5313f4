"""no-routing-bias: the experts are chosen by their scores alone (no per-expert selection bias)."""

from __future__ import annotations

import libcst as cst

from autoport_cst.transform import Codemod, Example, FileContext
from autoport_cst.transform.cst.snippets import parse_expr
from autoport_cst.transform.cst.vocabulary import (
    code_of,
    self_assignment,
    self_attr,
    string_text,
    walk,
)
from autoport_cst.transform.edit.tree import rewrite
from autoport_cst.transform.realizes import Realizes, to

ID = "no-routing-bias"
GROUP_PARAMS = ("n_group", "topk_group")


class NoRoutingBias(Codemod):
    """Choose the experts by their scores alone: the per-expert selection bias goes (DeepSeek-V2).

    The reference's top-k function (a module-level function whose first
    parameter, the scores, it adds another parameter to: ``choice = scores +
    correction_bias``) is called with the bias parameter of the MoE module
    (``self.e_score_correction_bias``). That argument becomes zeros of one
    row of the scores (``scores.new_zeros(scores.shape[-1])``), the
    parameter's ``nn.Parameter`` statement goes, and so does every checkpoint
    mapping entry of it (a dict key ending in ``.<attribute>``): a checkpoint
    without the tensor loads.

    Preconditions: the function, one call of it passing ``self.<bias>``, and
    no other use of that attribute than its assignment and the mapping.
    """

    ID = ID
    REALIZES = Realizes({"moe.routing_bias": to(False)})
    EXAMPLES = (
        Example(
            title="the correction bias removed from the choice, the module and the checkpoint keys",
            before="""
                def group_limited_topk(scores, correction_bias, top_k, n_group, topk_group):
                    choice = scores + correction_bias
                    return choice.topk(top_k, dim=-1).indices


                class DeepseekV3MoE(nn.Module):
                    def __init__(self, config):
                        self.router_weight = nn.Parameter(torch.empty(4, 8))
                        self.e_score_correction_bias = nn.Parameter(torch.empty(4))

                    def _route(self, hidden_states):
                        scores = torch.sigmoid(hidden_states @ self.router_weight.T)
                        chosen = group_limited_topk(scores, self.e_score_correction_bias, 2, 1, 1)
                        return chosen


                def moe_keys(module):
                    return {
                        f"{module}.router_weight": f"{module}.gate.weight",
                        f"{module}.e_score_correction_bias": f"{module}.gate.e_score_correction_bias",
                    }
            """,
            after="""
                def group_limited_topk(scores, correction_bias, top_k, n_group, topk_group):
                    choice = scores + correction_bias
                    return choice.topk(top_k, dim=-1).indices


                class DeepseekV3MoE(nn.Module):
                    def __init__(self, config):
                        self.router_weight = nn.Parameter(torch.empty(4, 8))

                    def _route(self, hidden_states):
                        scores = torch.sigmoid(hidden_states @ self.router_weight.T)
                        chosen = group_limited_topk(scores, scores.new_zeros(scores.shape[-1]), 2, 1, 1)
                        return chosen


                def moe_keys(module):
                    return {
                        f"{module}.router_weight": f"{module}.gate.weight",
                    }
            """,
        ),
        Example(
            title="no biased top-k",
            before="""
                def route(scores, top_k):
                    return scores.topk(top_k, dim=-1).indices
            """,
            raises="no top-k function adding a bias to the scores",
        ),
    )

    def transform_module(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        found = _biased_topk(module)
        if found is None:
            raise ctx.precondition(
                "no-routing-bias: no top-k function adding a bias to the scores in this file "
                "(def f(scores, bias, ...): choice = scores + bias)"
            )
        func, index = found
        calls = [
            n
            for n in walk(module)
            if isinstance(n, cst.Call) and code_of(n.func) == func.name.value and len(n.args) > index
        ]
        biases = {self_attr(c.args[index].value) for c in calls} - {None}
        if not calls or not biases:
            return module  # the bias is gone already: every call passes something else
        if len(biases) != 1:
            raise ctx.precondition(
                f"no-routing-bias: {func.name.value} is passed {sorted(biases)}", func, module
            )
        attr = biases.pop()
        edits: dict = {}
        for call in calls:
            if self_attr(call.args[index].value) == attr:
                scores = code_of(call.args[0].value)
                zeros = parse_expr(f"{scores}.new_zeros({scores}.shape[-1])", module)
                edits[id(call.args[index].value)] = lambda updated, zeros=zeros: zeros
        _drop_parameter(module, attr, edits)
        _drop_mapping(module, attr, edits)
        others = [
            n
            for n in walk(module)
            if self_attr(n) == attr and not any(n is c.args[index].value for c in calls)
        ]
        assigned = [
            n for n in walk(module) if self_assignment(n) is not None and self_assignment(n)[0] == attr
        ]
        if len(others) > len(assigned):
            raise ctx.precondition(
                f"no-routing-bias: self.{attr} is used elsewhere than the top-k call", others[-1], module
            )
        return rewrite(module, edits)


def _biased_topk(module: cst.Module) -> tuple[cst.FunctionDef, int] | None:
    """The module-level function adding a parameter to its first one, and
    that parameter's position."""
    for stmt in module.body:
        if not isinstance(stmt, cst.FunctionDef) or len(stmt.params.params) < 2:
            continue
        names = [p.name.value for p in stmt.params.params]
        for node in walk(stmt):
            if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Add):
                sides = [code_of(node.left), code_of(node.right)]
                if sides[0] == names[0] and sides[1] in names[1:]:
                    return stmt, names.index(sides[1])
    return None


def _drop_parameter(module: cst.Module, attr: str, edits: dict) -> None:
    for node in walk(module):
        if isinstance(node, cst.SimpleStatementLine):
            assigned = self_assignment(node)
            if assigned is not None and assigned[0] == attr and "Parameter" in code_of(assigned[1]):
                edits[id(node)] = lambda updated: cst.RemoveFromParent()


def _drop_mapping(module: cst.Module, attr: str, edits: dict) -> None:
    """Dict entries whose key ends in ``.<attr>`` go (the last one's comma and
    line break stay with the entry before it)."""
    for node in walk(module):
        if not isinstance(node, cst.Dict):
            continue
        doomed = [e for e in node.elements if isinstance(e, cst.DictElement) and _key_ends(e.key, f".{attr}")]
        if not doomed or len(doomed) == len(node.elements):
            continue

        def edit(updated: cst.Dict, doomed=doomed, original=node) -> cst.Dict:
            kept = [u for o, u in zip(original.elements, updated.elements, strict=True) if o not in doomed]
            if original.elements[-1] in doomed:
                kept[-1] = kept[-1].with_changes(comma=updated.elements[-1].comma)
            return updated.with_changes(elements=kept)

        edits[id(node)] = edit


def _key_ends(key: cst.BaseExpression, suffix: str) -> bool:
    text = string_text(key) if isinstance(key, cst.SimpleString) else None
    if isinstance(key, cst.FormattedString) and key.parts:
        last = key.parts[-1]
        text = last.value if isinstance(last, cst.FormattedStringText) else None
    return text is not None and text.endswith(suffix)
