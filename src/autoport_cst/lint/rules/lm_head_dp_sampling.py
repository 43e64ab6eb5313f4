"""NRN010 lm-head-dp-sampling."""

from __future__ import annotations

from autoport_cst.lint.index import Site
from autoport_cst.lint.rule import Invalid, Rule, Valid
from autoport_cst.transform.anatomy.sampling import cut_samplings


class LmHeadDpSampling(Rule):
    """An on-device sampler call on the forward path whose logits an earlier
    branch on LM-head data parallelism cut to this rank's rows.

    Why: with ``lm_head_dp_size > 1`` every rank of an LM-head TP group
    computes the logits of all LM-head-DP ranks' rows over its share of the
    vocabulary, and the sampler reduces over that group. Once each rank has
    cut the logits back to its own rows, the ranks of the group hold
    different rows, and the sampler combines them: the tokens come from
    other requests' logits. The real vllm_neuron llama3 does this, and
    nothing in vllm_neuron refuses LM-head DP with on-device sampling (its
    gpt-oss decode recipe sets both). Our references sample every row, with
    the sampling parameters and logit masks gathered over the LM-head DP
    group, and keep their own tokens after.

    What counts: the sampler's first argument is a name ``X`` that an
    ``if`` whose test reads ``lm_head_dp_size`` or ``lm_head_dp_group``
    reassigned as ``X = X[...]`` earlier in the same function, and no
    ``raise`` under such an ``if`` comes between.

    Fix: ``lm-head-dp-sampling-guard`` refuses the pair right before the
    sampler (``if <that test>: raise NotImplementedError(...)``); ``apply``
    runs it as a repair step on a reference that breaks this rule.

    Example::

        if self.lm_head_dp_size > 1:
            logits = logits[rank * rows : (rank + 1) * rows]
        tokens = self.sampler(logits, sampling_params)      # NRN010
    """

    CODE = "NRN010"
    NAME = "lm-head-dp-sampling"
    MESSAGE = "the sampler samples logits cut to this rank's LM-head-DP rows"
    SCOPE = "forward"
    FIX = "lm-head-dp-sampling-guard"
    REPAIR = True

    VALID = (
        Valid(
            """
            class LlamaForCausalLM(nn.Module):
                def forward(self, hidden, sampling_params):
                    logits = self.lm_head(hidden)
                    own_rows = slice(None)
                    if self.lm_head_dp_size > 1:
                        rows = logits.shape[0] // self.lm_head_dp_size
                        own_rows = slice(self.lm_head_dp_group.rank_in_group * rows, None)
                    tokens = self.sampler(logits, sampling_params)
                    return tokens[own_rows]
            """,
            title="every row sampled, the own rows kept after",
        ),
        Valid(
            """
            class LlamaForCausalLM(nn.Module):
                def forward(self, hidden, sampling_params):
                    logits = self.lm_head(hidden)
                    if self.lm_head_dp_size > 1:
                        logits = logits[: hidden.shape[0]]
                    if self.lm_head_dp_size > 1:
                        raise NotImplementedError("on-device sampling with LM-head data parallelism")
                    return self.sampler(logits, sampling_params)
            """,
            title="refused before the sampler",
        ),
    )
    INVALID = (
        Invalid(
            """
            class LlamaForCausalLM(nn.Module):
                def forward(self, hidden, sampling_params, rank):
                    logits = self.lm_head(hidden)
                    if self.lm_head_dp_size > 1:
                        rows = hidden.shape[0] // self.lm_head_dp_size
                        dp_rank = self.lm_head_dp_group.rank_in_group
                        logits = logits[dp_rank * rows : (dp_rank + 1) * rows]
                    if self.on_device_sampling_config is None:
                        return logits
                    tokens = self.sampler(logits, sampling_params, tp_rank=rank)
                    return tokens
            """,
            at=((10, 18),),
            message="LM-head",
            fixable=True,
            title="the logits cut to the own rows, then sampled",
        ),
    )

    def finish(self) -> None:
        for fn in sorted(self.ctx.forward_path(), key=lambda f: f.qualname):
            for found in cut_samplings(fn.node):
                self.report(
                    found.call.func,
                    "on-device sampling of logits an LM-head-DP branch cut to this rank's rows: the "
                    "sampler reduces over the LM-head TP group, whose ranks then hold other requests' "
                    "rows, so the tokens are drawn from them (sample every row and keep the own "
                    "tokens after, or refuse the pair)",
                    site=Site(fn, fn.cls, found.statement, False),
                )
