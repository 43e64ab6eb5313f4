"""The bf16 smoke test's checks: served bfloat16 logits judged by the
validator's bf16 logit gates (``validate.metrics.logit_metrics``).

In bfloat16 the port and transformers each round in their own way, and on a
tiny random model that rounding (about 1.5 % of the logit scale for
transformers itself against float32) exceeds the gap between the two best
tokens at some steps: a correct port then picks another token than
transformers' bf16 run, and every later token follows a different prefix.
Exact tokens would fail a correct port, and tokens alone say nothing of how
far it is off. So the served run returns its raw logits over the whole
vocabulary at every step (vLLM's ``logprobs_mode="raw_logits"``), and
transformers is run teacher-forced along the served tokens, in float32
(``f``) and in eager bf16 (``b``): each served row ``t`` is compared at the
same prefix. The gates are those ``validate`` applies to a bf16 port's
logits (docs/validation.md, "Verdict and tolerances"): the Neuron
multi-prompt verdict (every token passes the two-way check against ``b``, or
σ-ratio ≤ 1.0, or Bhattacharyya ≥ 0.99), the three-way check (and per
sequence L∞ ratio < 5, L2 ratio < 3), the cosine with float32, top-1
agreement with float32 > 50 % and greedy match with float32 > 30 %; a
sequence is one completion.
"""

from __future__ import annotations

from typing import Any

from .battery import Completion
from .checks import Check


def bf16_logit_checks(label: str, served: list[tuple[Completion, Any]], reference: Any) -> list[Check]:
    """``served``: each completion with its served logits ``[n, vocab]``."""
    import torch

    from autoport_cst.validate import metrics as M

    targets: list[torch.Tensor] = []
    fp32: list[torch.Tensor] = []
    bf16: list[torch.Tensor] = []
    positions: list[tuple[str, int, int]] = []
    greedy_rows: list[list[int]] = []
    greedy_tokens: list[list[int]] = []
    rows = 0
    for sequence, (completion, logits) in enumerate(served):
        f, b = reference.logits(completion.prompt_token_ids, completion.token_ids)
        count, first = len(completion.token_ids), len(completion.prompt_token_ids)
        targets.append(logits[:, : f.shape[-1]].float())
        fp32.append(f)
        bf16.append(b)
        positions += [("decode", sequence, first + step) for step in range(count)]
        greedy_rows.append(list(range(rows, rows + count)))
        greedy_tokens.append([int(token) for token in f.argmax(-1)])
        rows += count
    f, b = torch.cat(fp32), torch.cat(bf16)
    found = M.logit_metrics(torch.cat(targets), b, f, b, positions, greedy_rows, greedy_tokens, "bf16")
    return [
        Check(f"{label}: bf16 logits pass validate's gate {gate}", passed, _detail(found))
        for gate, passed in found.gates.items()
    ]


def _detail(found: Any) -> str:
    return (
        f"{found.tokens} served rows; two-way {found.tokens_passed}/{found.tokens} tokens; "
        f"σ-ratio {found.sigma_ratio:.3f}; Bhattacharyya {found.bhattacharyya:.3f}; "
        f"L∞ ratio {found.linf_ratio_max:.2f}; L2 ratio {found.l2_ratio_max:.2f}; "
        f"cosine p5 {found.cosine_p5:.4f}; top-1 {found.top1_agreement:.0%}; greedy {found.greedy_match:.0%}"
    )
