"""On-device sampling after the logits were cut to a rank's LM-head-DP rows.

With LM-head data parallelism (``lm_head_dp_size > 1``) each rank computes
the logits of every LM-head-DP rank's rows, over its share of the
vocabulary; the sampler reduces over the LM-head TP group, whose ranks hold
different replicas' rows once each has cut the logits back to its own. A
forward that cuts first and samples the cut rows (the real vllm_neuron
llama3: ``logits = logits[dp_rank * B_local : ...]`` under ``if
self.lm_head_dp_size > 1:``, then ``self.sampler(logits, ...)``) returns
tokens drawn from other replicas' rows. Our references sample every row and
keep their own tokens afterwards. Read by lint rule NRN010 and its fix.
"""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from autoport_cst.transform.cst.vocabulary import deep_statements, dotted, nodes_of, positional_args

LM_HEAD_DP = ("lm_head_dp_size", "lm_head_dp_group")


@dataclass(frozen=True)
class CutSampling:
    """A sampler call on logits an earlier LM-head-DP branch cut."""

    call: cst.Call
    statement: cst.BaseStatement  # the statement holding the call
    test: cst.BaseExpression  # the test of the branch that cut the logits


def cut_samplings(func: cst.FunctionDef) -> list[CutSampling]:
    """The sampler calls of ``func`` (``self.sampler(X, ...)``, ``self.<...>_sampler``)
    whose first argument a name ``X`` that an earlier ``if`` on LM-head DP cut
    (``X = X[...]`` in its body), with no ``raise`` under an ``if`` on LM-head
    DP between the cut and the call. Statements in source order, nested
    functions and classes left out."""
    cut: dict[str, cst.BaseExpression] = {}
    found = []
    for statement in deep_statements(func):
        if isinstance(statement, cst.If) and _on_lm_head_dp(statement.test):
            body = list(deep_statements(statement.body))
            if any(isinstance(s, cst.SimpleStatementLine) and _raises(s) for s in body):
                cut.clear()  # a guard refuses LM-head DP from here on
            cut.update({name: statement.test for name in _cut_names(body)})
            continue
        if not cut or not isinstance(statement, cst.SimpleStatementLine):
            continue  # no call is searched before a cut: most forwards never cut
        for call in nodes_of(statement, cst.Call):
            assert isinstance(call, cst.Call)
            name = _sampled_name(call)
            if name is not None and name in cut:
                found.append(CutSampling(call, statement, cut[name]))
    return found


def _on_lm_head_dp(test: cst.BaseExpression) -> bool:
    return any((isinstance(n, cst.Name) and n.value in LM_HEAD_DP) for n in nodes_of(test, cst.Name))


def _raises(statement: cst.SimpleStatementLine) -> bool:
    return any(isinstance(small, cst.Raise) for small in statement.body)


def _cut_names(body: list[cst.BaseStatement]) -> list[str]:
    """``X`` of each ``X = X[...]`` in ``body``."""
    names = []
    for statement in body:
        if not isinstance(statement, cst.SimpleStatementLine):
            continue
        for small in statement.body:
            if (
                isinstance(small, cst.Assign)
                and len(small.targets) == 1
                and isinstance(small.targets[0].target, cst.Name)
                and isinstance(small.value, cst.Subscript)
                and isinstance(small.value.value, cst.Name)
                and small.value.value.value == small.targets[0].target.value
            ):
                names.append(small.targets[0].target.value)
    return names


def _sampled_name(call: cst.Call) -> str | None:
    """``X`` of ``self.sampler(X, ...)`` (or ``self.<...>_sampler``)."""
    name = dotted(call.func) or ""
    if not name.startswith("self.") or not (name == "self.sampler" or name.endswith("_sampler")):
        return None
    args = positional_args(call)
    first = args[0].value if args else None
    return first.value if isinstance(first, cst.Name) else None
