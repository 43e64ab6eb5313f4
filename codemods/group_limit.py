"""group-limit: how the experts are chosen within groups (DeepSeek's n_group / topk_group), or a plain top-k."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import libcst as cst

from autoport_cst.transform import Codemod, Example, FileContext, PortContext
from autoport_cst.transform.cst.snippets import parse_expr
from autoport_cst.transform.cst.vocabulary import code_of, simple_assign, statements, walk
from autoport_cst.transform.edit.tree import rewrite, with_comment

ID = "group-limit"
GROUP_PARAMS = ("n_group", "topk_group")
SCORES = {
    "sum_top2": "{g}.topk(min(2, {g}.shape[-1]), dim=-1).values.sum(dim=-1)",
    "max": "{g}.max(dim=-1).values",
}
COMMENT = "<-- MODEL-SPECIFIC: a plain top-k over every expert (no group limit)"


@dataclass(frozen=True)
class GroupLimitParams:
    form: Literal["none", "sum_top2", "max"] = field(
        default="none",
        metadata={
            "doc": "none: a plain top-k (n_group ignored); sum_top2: a group scored by the sum of its two best "
            "selection scores (DeepSeek-V3); max: by its best one (DeepSeek-V2's group_limited_greedy)."
        },
    )


class GroupLimit(Codemod):
    """Choose the experts among the best groups scored another way, or by a plain top-k.

    The group-limited top-k function of the model file (a module-level
    function taking ``n_group`` and ``topk_group``) keeps the ``topk_group``
    best of ``n_group`` groups in a block ``if n_group > 1:``; the
    statement that scores the groups (the one whose result is ranked with
    ``topk_group``) is what differs between the families:

    - ``sum_top2``: the sum of a group's two best selection scores
      (DeepSeek-V3, GLM-4-MoE);
    - ``max``: its best score (DeepSeek-V2's ``group_limited_greedy``);
    - ``none``: the block is removed: a plain top-k over every expert,
      whatever ``n_group`` says (DeepSeek-V2's ``greedy``, which ignores it).

    Preconditions: such a function with the ``if`` on ``n_group`` and one
    group-score assignment in it (for ``none``, a function without the block
    is already plain and comes back unchanged).
    """

    ID = ID
    REALIZES = ("moe.group_limit",)
    Params = GroupLimitParams
    EXAMPLES = (
        Example(
            title="groups scored by their best expert (DeepSeek-V2's group_limited_greedy)",
            params={"form": "max"},
            before="""
                def group_limited_topk(scores, correction_bias, top_k, n_group, topk_group):
                    choice = scores + correction_bias
                    if n_group > 1:
                        tokens, experts = choice.shape
                        grouped = choice.view(tokens, n_group, experts // n_group)
                        group_scores = grouped.topk(min(2, experts // n_group), dim=-1).values.sum(dim=-1)
                        best_groups = group_scores.topk(topk_group, dim=-1).indices
                        choice = mask(choice, best_groups)
                    return choice.topk(top_k, dim=-1).indices
            """,
            after="""
                def group_limited_topk(scores, correction_bias, top_k, n_group, topk_group):
                    choice = scores + correction_bias
                    if n_group > 1:
                        tokens, experts = choice.shape
                        grouped = choice.view(tokens, n_group, experts // n_group)
                        group_scores = grouped.max(dim=-1).values
                        best_groups = group_scores.topk(topk_group, dim=-1).indices
                        choice = mask(choice, best_groups)
                    return choice.topk(top_k, dim=-1).indices
            """,
        ),
        Example(
            title="a plain top-k (DeepSeek-V2's greedy)",
            params={"form": "none"},
            before="""
                def group_limited_topk(scores, correction_bias, top_k, n_group, topk_group):
                    choice = scores + correction_bias
                    if n_group > 1:
                        grouped = choice.view(-1, n_group, choice.shape[-1] // n_group)
                        group_scores = grouped.topk(2, dim=-1).values.sum(dim=-1)
                        choice = mask(choice, group_scores.topk(topk_group, dim=-1).indices)
                    return choice.topk(top_k, dim=-1).indices
            """,
            after="""
                def group_limited_topk(scores, correction_bias, top_k, n_group, topk_group):
                    choice = scores + correction_bias
                    # <-- MODEL-SPECIFIC: a plain top-k over every expert (no group limit)
                    return choice.topk(top_k, dim=-1).indices
            """,
        ),
        Example(
            title="no group-limited top-k",
            params={"form": "max"},
            before="""
                def route(scores, top_k):
                    return scores.topk(top_k, dim=-1).indices
            """,
            raises="no group-limited top-k",
        ),
    )

    @classmethod
    def params_for(cls, diffs, target, port: PortContext) -> GroupLimitParams:
        return GroupLimitParams(form=target.moe.group_limit if target.moe is not None else "none")

    def transform_module(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        func = _group_function(module)
        if func is None:
            raise ctx.precondition(
                "group-limit: no group-limited top-k in this file (a module-level function taking "
                "n_group and topk_group)"
            )
        block = _group_block(func)
        if block is None:
            if self.params.form == "none":
                return module
            raise ctx.precondition(
                f"group-limit: {func.name.value} has no `if n_group ...:` block to score groups in",
                func,
                module,
            )
        if self.params.form == "none":
            return _remove_block(module, func, block)
        score = _score_statement(block)
        if score is None:
            raise ctx.precondition(
                f"group-limit: no statement in {func.name.value}'s group block scores the groups "
                "(an assignment whose result is ranked with topk_group)",
                block,
                module,
            )
        _, value = simple_assign(score)  # type: ignore[misc]
        grouped = _grouped_name(block, score)
        if grouped is None:
            raise ctx.precondition("group-limit: the grouped scores are not a name", score, module)
        new = SCORES[self.params.form].format(g=grouped)
        if code_of(value) == new:
            return module
        return rewrite(module, {id(value): lambda updated: parse_expr(new, module)})


def _group_function(module: cst.Module) -> cst.FunctionDef | None:
    for stmt in module.body:
        if isinstance(stmt, cst.FunctionDef):
            names = {p.name.value for p in stmt.params.params}
            if all(n in names for n in GROUP_PARAMS):
                return stmt
    return None


def _group_block(func: cst.FunctionDef) -> cst.If | None:
    for stmt in statements(func):
        if isinstance(stmt, cst.If) and any(
            isinstance(n, cst.Name) and n.value == "n_group" for n in walk(stmt.test)
        ):
            return stmt
    return None


def _score_statement(block: cst.If) -> cst.BaseStatement | None:
    """The assignment ``name = ...`` whose name a later statement ranks with
    ``name.topk(topk_group, ...)``."""
    body = list(block.body.body)
    for index, stmt in enumerate(body):
        assigned = simple_assign(stmt)
        if assigned is None or not isinstance(assigned[0], cst.Name):
            continue
        name = assigned[0].value
        for later in body[index + 1 :]:
            for node in walk(later):
                if (
                    isinstance(node, cst.Call)
                    and isinstance(node.func, cst.Attribute)
                    and node.func.attr.value == "topk"
                    and code_of(node.func.value) == name
                    and any(code_of(a.value) == "topk_group" for a in node.args)
                ):
                    return stmt
    return None


def _grouped_name(block: cst.If, score: cst.BaseStatement) -> str | None:
    """The name assigned before the score statement that it reads (the
    scores viewed per group)."""
    body = list(block.body.body)
    earlier: list[str] = []
    for stmt in body[: body.index(score)]:
        assigned = simple_assign(stmt)
        if assigned is not None and isinstance(assigned[0], cst.Name):
            earlier.append(assigned[0].value)
    _, value = simple_assign(score)  # type: ignore[misc]
    read = [n.value for n in walk(value) if isinstance(n, cst.Name)]
    found = [name for name in reversed(earlier) if name in read]
    return found[0] if found else None


def _remove_block(module: cst.Module, func: cst.FunctionDef, block: cst.If) -> cst.Module:
    body = list(statements(func))
    following = body[body.index(block) + 1] if body.index(block) + 1 < len(body) else None
    edits: dict = {id(block): lambda updated: cst.RemoveFromParent()}
    if following is not None:
        edits[id(following)] = lambda updated: with_comment(updated, COMMENT)
    return rewrite(module, edits)
