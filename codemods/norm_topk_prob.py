"""norm-topk-prob: whether the chosen experts' weights are renormalized, fixed in the code."""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from autoport_cst.transform import Codemod, Example, FileContext, PortContext
from autoport_cst.transform.cst.snippets import parse_expr
from autoport_cst.transform.cst.vocabulary import code_of, self_assignment, walk
from autoport_cst.transform.edit.tree import rewrite, with_comment

ID = "norm-topk-prob"
ATTR = "norm_topk_prob"
COMMENT = "<-- MODEL-SPECIFIC: the chosen experts' weights are {what} renormalized (whatever the config says)"


@dataclass(frozen=True)
class NormTopkProbParams:
    renormalize: bool = field(
        default=False, metadata={"doc": "Renormalize the top-k weights to sum to 1 (True) or not (False)."}
    )


class NormTopkProb(Codemod):
    """Fix whether the chosen experts' weights are renormalized, instead of reading ``norm_topk_prob``.

    A reference that reads ``config.norm_topk_prob`` follows a field that a
    model may not read at all: DeepSeek-V2 never renormalizes, whatever its
    config says. Every ``self.norm_topk_prob = <expression>`` of the model
    file becomes ``self.norm_topk_prob = True`` or ``False``; the code that
    reads the attribute is unchanged.

    Preconditions: at least one ``self.norm_topk_prob = ...`` assignment.
    """

    ID = ID
    REALIZES = ("moe.norm_topk_prob",)
    Params = NormTopkProbParams
    EXAMPLES = (
        Example(
            title="never renormalized (DeepSeek-V2)",
            params={"renormalize": False},
            before="""
                class DeepseekV3MoE(nn.Module):
                    def __init__(self, config):
                        self.norm_topk_prob = config.norm_topk_prob
            """,
            after="""
                class DeepseekV3MoE(nn.Module):
                    def __init__(self, config):
                        # <-- MODEL-SPECIFIC: the chosen experts' weights are not renormalized (whatever the config says)
                        self.norm_topk_prob = False
            """,
        ),
        Example(
            title="no renormalization setting",
            before="""
                class LlamaMLP(nn.Module):
                    def __init__(self, config):
                        self.hidden_size = config.hidden_size
            """,
            raises="no self.norm_topk_prob",
        ),
    )

    @classmethod
    def params_for(cls, diffs, target, port: PortContext) -> NormTopkProbParams:
        return NormTopkProbParams(renormalize=bool(target.moe is not None and target.moe.norm_topk_prob))

    def transform_module(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        wanted = str(self.params.renormalize)
        found = [
            node
            for node in walk(module)
            if isinstance(node, cst.SimpleStatementLine)
            and self_assignment(node) is not None
            and self_assignment(node)[0] == ATTR
        ]
        if not found:
            raise ctx.precondition(f"norm-topk-prob: no self.{ATTR} = ... in this file")
        comment = COMMENT.format(what="" if self.params.renormalize else "not").replace("are  ", "are ")
        edits: dict = {}
        for stmt in found:
            _, value = self_assignment(stmt)  # type: ignore[misc]
            if code_of(value) == wanted:
                continue
            new = parse_expr(wanted, module)

            def edit(updated, new=new, value=value):
                line = updated.with_changes(
                    body=[updated.body[0].with_changes(value=new)] + list(updated.body[1:])
                )
                return with_comment(line, comment)

            edits[id(stmt)] = edit
        return rewrite(module, edits)
