"""The embedding and LM head sections of the spec: the vocabulary, tying
(the config's, checked against what the class declares and what the
checkpoint stores), the embedding scale and multiplier, learned positions,
and the head's bias, softcap and logit rescaling with its config field."""

from __future__ import annotations

from autoport_cst.research.decide.state import Decider
from autoport_cst.research.findings import CHECKPOINT, CODE, CONFIG, known, unknown
from autoport_cst.spec import EmbeddingSpec, LMHeadSpec
from autoport_cst.spec.model import LogitsForm


def embedding(d: Decider) -> EmbeddingSpec:
    learned = d.flag("embedding.learned_positions", False)
    sinusoidal = d.flag("embedding.sinusoidal_positions", False)
    key, offset = _positions_table(d) if learned else (None, 0)
    if sinusoidal and not learned:
        offset = d.flag("embedding.positions_offset", 0)
    return EmbeddingSpec(
        vocab_size=d.cfg.dims.get("vocab_size"),
        tied=_tied(d),
        scale=d.decide("embedding.scale", "none", (CODE,)),
        scale_dtype=d.flag("embedding.scale_dtype", "model"),
        multiplier=d.decide("embedding.multiplier", None, (CODE,)),
        learned_positions=learned,
        positions_key=key,
        positions_offset=offset,
        norm=d.flag("embedding.norm", False),
        sinusoidal_positions=sinusoidal,
        positions_base=d.flag("embedding.positions_base", None) if sinusoidal else None,
        positions_padding_key=d.flag("embedding.positions_padding_key", None) if sinusoidal else None,
    )


# rows a learned position table may keep before position 0 (OPT and BioGPT: 2)
_POSITION_OFFSETS = (0, 1, 2)


def _positions_table(d: Decider) -> tuple[str | None, int]:
    """The config field sizing the learned position table and the rows the
    table keeps before position 0: its rows (stored in the checkpoint, else
    the shape the code builds) minus a config.json count of positions."""
    path = d.code.module_names.get("model.embed_positions") if d.code is not None else None
    stored_table = d.ckpt.tensors.get(f"{path}.weight") if d.ckpt is not None and path else None
    shape = d.code.expected.get(f"{path}.weight") if d.code is not None and path else None
    if stored_table is not None:  # OPT's table: max_position_embeddings + 2 rows, built in a subclass
        shape = stored_table.shape
    rows = shape[0] if shape else None
    stored = getattr(type(d.cfg.resolved), "attribute_map", None) or {}  # GPT-2: n_positions, not its alias
    counts = {
        stored.get(k, k): v
        for k, v in d.cfg.raw.items()
        if isinstance(v, int) and not isinstance(v, bool) and any(w in k for w in ("position", "ctx"))
    }
    for offset in _POSITION_OFFSETS:
        keys = sorted(k for k, v in counts.items() if rows is not None and rows - v == offset)
        if keys:
            evidence = f"{path}.weight has {rows} rows = config.{keys[0]} + {offset}"
            d.decisions.append(known(keys[0], "embedding.positions_key", CODE, evidence))
            return keys[0], offset
    found = f"{path}.weight has {rows} rows" if rows is not None else "no single position table found"
    d.decisions.append(
        unknown("embedding.positions_key", CODE, f"{found}; no config.json count of positions")
    )
    d.unknown.append("embedding.positions_key")
    return None, 0


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
    tied = d.decide("embedding.tied", False, (CONFIG, CODE))  # the code's only where the config says nothing
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
