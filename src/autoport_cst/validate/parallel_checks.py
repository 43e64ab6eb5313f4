"""The parallel layouts a default validation runs after its TP=1 fp32 run.

A TP=1 run executes the port's parallel code with identity values: rank 0 of
one rank, data-parallel groups of one. Rank and size arithmetic that is wrong
(``world_size > 1`` read as ``> 2``, ``+ rank * size`` as ``-``, a shard
offset of the wrong rank, a data-parallel gather left out) gives the right
numbers there. So a plain TP=1 fp32 validation that passes goes on, on the
same checkpoint and prompts, to the smallest layouts that give that code
other values (``LAYOUTS``):

- ``TP=2``: two tensor-parallel ranks (sharded weights, the sequence-parallel
  prefill, the collectives);
- ``attention DP 2``: TP=1 with the attention data-parallel over 2 ranks in
  the decode graph (a disaggregated run: ``layout_session``);
- ``DP 2 (MLP, embedding, LM head)``: TP=1 with the MLP, the embedding and
  the LM head each data-parallel over 2 ranks in the decode graph (apart from
  the attention's, which some ports refuse);
- ``embedding DP 2``: the embedding alone data-parallel over 2 ranks. With
  every component at DP 2 the embedding's and the MLP's DP groups are the
  same, and the transition of the decode batch between them is the identity;
  here they differ;
- ``2 tokens per decode step`` (TP=1): every decode call feeds two new
  tokens per sequence (the teacher's next two, with
  ``decode_token_threshold`` 2), as the runner's verification step of
  speculative decoding with one draft token does; the logits of both rows
  are compared. A port whose forward takes no ``spec_decode_metadata`` (no
  speculative decoding) is reported as refusing it;
- ``prompt embeddings`` (TP=1) and ``prompt embeddings at TP=2``: every odd
  prompt position fed as transformers' input embedding of its id
  (``inputs_embeds``, ``is_token_ids`` false), as vllm_neuron's runner does
  with ``enable_prompt_embeds``; at TP=2 the port cuts them to its
  sequence-parallel slice (``driver._embed_prompt``). A port whose forward
  does not name both arguments is reported as refusing them;
- ``EP 2 at TP=2``, for a mixture-of-experts checkpoint only (``MOE_LAYOUTS``):
  the experts split into two expert-parallel partitions of one rank each, so
  each rank holds half of the experts whole (at TP=2 without EP each holds
  every expert's half). The code only expert parallelism runs (the local
  expert range, the decode kernel's all-expert mode with the rank's
  ``rank_id``) gets other values than at TP=1, where a rank holds every
  expert. A port that refuses EP by its own guard is reported as not run.

Each runs as ``validate --tp 2`` / ``--attention-dp 2`` / ``--mlp-dp 2
--embedding-dp 2 --lm-head-dp 2`` / ``--embedding-dp 2`` would, with its ranks
as local processes;
the transformers run of the TP=1 validation is reused (``reference_reuse``).
A layout the checkpoint cannot take (the tensor-parallel rules refuse TP=2,
prompt lengths given that it cannot split), or that the port refuses with a
NotImplementedError of its own (a guard a codemod wrote: q/k norms over all
heads under attention data parallelism, say), is reported as not run; the first
layout that fails fails the report, named after it, and ends the checks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from autoport_cst.errors import InputError

# (label, validate_model's options) of each layout, in the order they run
LAYOUTS: tuple[tuple[str, dict[str, int]], ...] = (
    ("TP=2", {"tp": 2}),
    ("attention DP 2", {"attention_dp": 2}),
    ("DP 2 (MLP, embedding, LM head)", {"mlp_dp": 2, "embedding_dp": 2, "lm_head_dp": 2}),
    ("embedding DP 2", {"embedding_dp": 2}),
    ("2 tokens per decode step", {"decode_tokens": 2}),
    ("prompt embeddings", {"prompt_embeds": True}),
    ("prompt embeddings at TP=2", {"tp": 2, "prompt_embeds": True}),
)
# after LAYOUTS, for a checkpoint with routed experts (their count, split in two)
MOE_LAYOUTS: tuple[tuple[str, dict[str, int]], ...] = (("EP 2 at TP=2", {"tp": 2, "ep": 2}),)


def check_parallel_layouts(report: Any, validate: Callable[..., Any], experts: int | None = None) -> None:
    """Validate the port at each of ``LAYOUTS`` (``validate(**options) ->
    ValidationReport``), and of ``MOE_LAYOUTS`` when the checkpoint has
    ``experts`` routed experts, into ``report.parallel_layouts``, until one
    fails: it makes ``report`` fail, named after it (the later ones are not run)."""
    for label, options in LAYOUTS + (MOE_LAYOUTS if experts else ()):
        entry: dict[str, Any] = {"label": label, "equivalent": None, "summary": None}
        report.parallel_layouts.append(entry)
        try:
            found = validate(**options)
        except InputError as refused:
            entry["summary"] = f"not run: {_first_line(refused)}"
            continue
        if found.failure is not None and found.failure.refusal:
            # the port's own guard (NotImplementedError) declares the layout unsupported
            entry["summary"] = (
                f"not run: the port refuses it ({found.failure.stage}: {found.failure.message})"
            )
            continue
        entry.update(equivalent=found.equivalent, summary=found.summary())
        if not found.equivalent:
            report.fail_as(label, found)
            return


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
