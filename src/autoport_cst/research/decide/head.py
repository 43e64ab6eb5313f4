"""The embedding and LM head sections of the spec: the vocabulary, tying
(the config's, checked against what the class declares and what the
checkpoint stores), the embedding scale and multiplier, learned positions,
and the head's bias, softcap and logit rescaling with its config field."""

from __future__ import annotations

from autoport_cst.research.decide.state import Decider
from autoport_cst.research.findings import CHECKPOINT, CODE, CONFIG
from autoport_cst.spec import EmbeddingSpec, LMHeadSpec
from autoport_cst.spec.model import LogitsForm


def embedding(d: Decider) -> EmbeddingSpec:
    return EmbeddingSpec(
        vocab_size=d.cfg.dims.get("vocab_size"),
        tied=_tied(d),
        scale=d.decide("embedding.scale", "none", (CODE,)),
        multiplier=d.decide("embedding.multiplier", None, (CODE,)),
        learned_positions=d.flag("embedding.learned_positions", False),
    )


def lm_head(d: Decider) -> LMHeadSpec:
    divisor = d.decide("lm_head.logits_divisor", None, (CODE,))
    logits_key = None
    logits_form: LogitsForm = "divisor"
    if divisor is not None:
        logits_key = d.decide("lm_head.logits_key", None, (CODE,))
        if logits_key is not None:
            logits_form = d.decide("lm_head.logits_form", "divisor", (CODE,))
    return LMHeadSpec(
        bias=d.decide("lm_head.bias", False, (CODE,)),
        softcap=d.decide("lm_head.softcap", None, (CODE,)),
        logits_divisor=divisor,
        logits_key=logits_key,
        logits_form=logits_form,
    )


def _tied(d: Decider) -> bool:
    tied = d.decide("embedding.tied", False, (CONFIG,))
    if d.code is not None and tied and not d.code.tied_keys_declared:
        d.conflict(
            "embedding.tied",
            [
                (CONFIG, True, "tie_word_embeddings"),
                (CODE, False, f"{d.code.causal_lm} declares no _tied_weights_keys"),
            ],
            "the spec takes False: transformers cannot tie what the class does not declare",
        )
        tied = False
    if d.ckpt is not None:
        head_key = d.code.head_key if d.code is not None else None
        if head_key is not None:
            stored: bool | None = head_key in d.ckpt.tensors
            evidence = f"{head_key} {'is' if stored else 'is not'} in the checkpoint"
        else:
            f = d.ckpt_finding("checkpoint.lm_head_stored")
            stored = f.value if f is not None else None
            evidence = f.evidence if f is not None else ""
        if stored is True and tied:
            d.conflict(
                "embedding.tied",
                [(CONFIG, True, "tie_word_embeddings"), (CHECKPOINT, "head stored", evidence)],
                "the spec keeps tied=True: transformers ties and ignores the stored head",
                "warning",
            )
        elif stored is False and not tied:
            d.conflict(
                "embedding.tied",
                [(CONFIG, False, "tie_word_embeddings"), (CHECKPOINT, "no head", evidence)],
                "the spec keeps tied=False: the head weight is missing from the checkpoint",
            )
    return tied
