"""Known pitfalls of porting a feature, declared beside what knows the
feature: a codemod's ``PITFALLS`` (``autoport_cst.transform.base.Codemod``),
or, for what no codemod realizes, ``SPEC_PITFALLS`` here by spec section.
Research collects them (``autoport_cst.research.pitfalls``) and the plan lists
those whose condition the model meets, by rank. Each is a consequence of a
feature, never of a model name; the wording follows the vllm_neuron anatomy
notes (§4 and §8)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from autoport_cst.spec.model import ArchSpec


class Facts(Protocol):
    """What research found beyond the spec (``code.qkv_layout``,
    ``checkpoint.quantized``, ...), by finding name."""

    def value(self, name: str, default: Any = None) -> Any:
        """The last known value found for ``name``, else ``default``."""
        ...

    def unknown(self, name: str) -> bool:
        """Whether a source could not classify ``name``."""
        ...


Condition = Callable[[ArchSpec, Facts], object]


@dataclass(frozen=True)
class Pitfall:
    """A trap of porting a feature. ``rank`` orders the plan's list (norms
    first, then attention, RoPE, checkpoint layouts, MLP, embeddings and head,
    residual, MoE; ranks are unique); ``when`` says whether a model has the
    feature; ``text`` is a template formatted with ``spec`` and ``facts``
    (``"{spec.attention.softcap:g}"``), or a function of both (None: no note)."""

    rank: int
    when: Condition
    text: str | Callable[[ArchSpec, Facts], str | None]

    def note(self, spec: ArchSpec, facts: Facts) -> str | None:
        if not self.when(spec, facts):
            return None
        if isinstance(self.text, str):
            return self.text.format(spec=spec, facts=facts)
        return self.text(spec, facts)


def _moe(spec: ArchSpec) -> bool:
    return spec.moe is not None


def _expert_layout(spec: ArchSpec, facts: Facts) -> str | None:
    layout = facts.value("checkpoint.expert_layout")
    if layout == "per_expert":
        return "experts stored one key per expert: stack them (gate then up) at load time"
    if layout == "stacked" or facts.value("code.stacked_experts"):
        return "experts stored as 3-D tensors: slice per rank/expert, check the [in, out] orientation"
    return None


# Spec sections no codemod realizes (or several share), in rank order.
SPEC_PITFALLS: tuple[Pitfall, ...] = (
    # attention
    Pitfall(
        110,
        lambda spec, facts: isinstance(spec.attention.head_dim, int) and spec.attention.head_dim > 128,
        "head_dim {spec.attention.head_dim} > 128: the NKI kernel paths want head_dim <= 128",
    ),
    Pitfall(
        120,
        lambda spec, facts: isinstance(spec.hidden_size, int) and spec.hidden_size % 128,
        "hidden size {spec.hidden_size} is not a multiple of 128 (kernel paths)",
    ),
    # mlp
    Pitfall(
        220,
        lambda spec, facts: spec.mlp.glu == "clamped_swiglu",
        "clamped SwiGLU (alpha {spec.mlp.glu_alpha}, limit {spec.mlp.glu_limit}): the MoE kernels' Swish has "
        "alpha 1.702 built in; fold the +1 of (up + 1) into the up bias and shift the up clamp by 1",
    ),
    # embedding (tied embeddings are read from the config)
    Pitfall(
        240,
        lambda spec, facts: spec.embedding.tied,
        "tied embeddings: map lm_head.weight to the embedding in load_weights (the checkpoint has no head)",
    ),
    # embedding, residual and head: one note for the three multiplier codemods
    Pitfall(
        270,
        lambda spec, facts: (
            spec.embedding.multiplier is not None
            or spec.residual.multiplier is not None
            or spec.lm_head.logits_divisor
        ),
        "constant multipliers (embedding / residual / logits): read them from the config, do not hard-code",
    ),
    # moe
    Pitfall(
        300,
        lambda spec, facts: _moe(spec),
        "MoE router: keep routing in float32 (name the router weight gate_weight so the adapter keeps "
        "it un-transposed and fp32); the router is replicated on every rank",
    ),
    Pitfall(310, lambda spec, facts: _moe(spec), _expert_layout),
)
