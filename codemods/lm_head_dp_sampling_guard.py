"""lm-head-dp-sampling-guard: on-device sampling of logits cut to a rank's LM-head-DP rows is refused."""

from __future__ import annotations

import libcst as cst

from autoport_cst.transform import Codemod, Example, FileContext
from autoport_cst.transform.anatomy.sampling import cut_samplings
from autoport_cst.transform.cst.snippets import parse_statement
from autoport_cst.transform.cst.vocabulary import code_of, nodes_of
from autoport_cst.transform.edit.tree import preceded_under_its_comments, rewrite, with_comment

MESSAGE = (
    "on-device sampling with LM-head data parallelism: this model cuts the logits to its own "
    "rows before the sampler, whose group then holds other requests' rows"
)
COMMENT = ">>> PARALLELISM: LM-head DP with on-device sampling is refused (the logits are cut first) <<<"


class LmHeadDpSamplingGuard(Codemod):
    """Refuse on-device sampling with LM-head data parallelism where the
    forward cuts the logits to this rank's rows before the sampler (lint rule
    NRN010).

    Right before each sampler call the rule reports, ``if <test>: raise
    NotImplementedError(...)``, with ``<test>`` the test of the branch that
    cut the logits (``self.lm_head_dp_size > 1``). The port then refuses the
    pair by name, where it returned tokens drawn from other requests' rows;
    every other configuration computes as before. The real vllm_neuron
    llama3 has this shape; ``apply`` runs this codemod as a repair step on a
    reference that breaks the rule. Sampling every row, as our references
    do, is the full repair; this one refuses instead of guessing the
    sampler's group.
    """

    ID = "lm-head-dp-sampling-guard"
    PURPOSE = "repair"
    TOUCHES = ()
    EXAMPLES = (
        Example(
            title="the logits cut to the own rows, then sampled",
            before="""
                class LlamaForCausalLM(nn.Module):
                    def forward(self, hidden, sampling_params, rank):
                        logits = self.lm_head(hidden)
                        if self.lm_head_dp_size > 1:
                            rows = hidden.shape[0] // self.lm_head_dp_size
                            first = self.lm_head_dp_group.rank_in_group * rows
                            logits = logits[first : first + rows]
                        if self.on_device_sampling_config is None:
                            return logits
                        tokens = self.sampler(logits, sampling_params, tp_rank=rank)
                        return tokens
            """,
            after="""
                class LlamaForCausalLM(nn.Module):
                    def forward(self, hidden, sampling_params, rank):
                        logits = self.lm_head(hidden)
                        if self.lm_head_dp_size > 1:
                            rows = hidden.shape[0] // self.lm_head_dp_size
                            first = self.lm_head_dp_group.rank_in_group * rows
                            logits = logits[first : first + rows]
                        if self.on_device_sampling_config is None:
                            return logits
                        # >>> PARALLELISM: LM-head DP with on-device sampling is refused (the logits are cut first) <<<
                        if self.lm_head_dp_size > 1:
                            raise NotImplementedError(
                                "on-device sampling with LM-head data parallelism: this model cuts the logits to its own rows before the sampler, whose group then holds other requests' rows"
                            )
                        tokens = self.sampler(logits, sampling_params, tp_rank=rank)
                        return tokens
            """,
        ),
        Example(
            title="every row sampled: unchanged",
            before="""
                class LlamaForCausalLM(nn.Module):
                    def forward(self, hidden, sampling_params):
                        logits = self.lm_head(hidden)
                        return self.sampler(logits, sampling_params)
            """,
            after="""
                class LlamaForCausalLM(nn.Module):
                    def forward(self, hidden, sampling_params):
                        logits = self.lm_head(hidden)
                        return self.sampler(logits, sampling_params)
            """,
        ),
    )

    def transform_module(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        edits = {}
        for func in nodes_of(module, cst.FunctionDef):
            for found in cut_samplings(func):
                guard = parse_statement(
                    f"if {code_of(found.test)}:\n    raise NotImplementedError(\n        {MESSAGE!r}\n    )",
                    module,
                )
                edits[id(found.statement)] = preceded_under_its_comments(with_comment(guard, COMMENT))
        return rewrite(module, edits)
