"""A per-head bias the backbone folds into the attention mask that an
attention kernel is given (Falcon-RW since transformers 5.25:
``causal_mask = masked_fill(alibi / sqrt(head_dim), causal_mask < -1, min)``,
passed as ``attention_mask`` to ``attention_interface``): the kernel adds
the mask, and so the bias, to its scores once.

Named ``unsupported.alibi_in_mask`` with what the code computes (the
builder, the number the bias is divided or multiplied by, the kernel it
reaches): research reads ALiBi where the attention adds the bias itself
(:mod:`.alibi`); a bias inside the mask a kernel receives is not read as
ALiBi (the port's kernels take no mask tensor). Without this reading, the
bias would go unseen (the kernel call hides the add) and the model would
read as one without positions."""

from __future__ import annotations

from typing import Any

from autoport_cst.research.analysis.graph import call_given, kernel_calls, number, strip_casts
from autoport_cst.research.analysis.layer_inputs import layer_arguments, layer_calls
from autoport_cst.research.analysis.state import AnalyzerState, AttentionGraph
from autoport_cst.research.findings import CODE, known
from autoport_cst.research.interp.values import Node
from autoport_cst.research.interp.walk import walk

_CARRIERS = {"view", "reshape", "to", "float", "type_as", "contiguous", "expand", "unsqueeze"}
_NOT_BUILDERS = frozenset(_CARRIERS | {"repeat"})


def read(st: AnalyzerState, g: AttentionGraph) -> None:
    """Name a bias built with the head count that reaches the kernel's mask."""
    heads = st.dims.get("num_heads")
    calls = layer_calls(st).get(0, [])
    kernels = kernel_calls(g.attn, g.nodes)
    if not calls or not kernels or not isinstance(heads, int) or st.backbone is None:
        return
    masks = {n.name for k in kernels for n in walk(_mask_argument(k)) if n.kind == "input"}
    for name, value in layer_arguments(st, 0, calls[0]).items():
        # not a reshape or copy of a tensor to that many rows: DeepSeek V4 expands its hidden
        # states into as many residual streams
        builder = call_given(value, heads, ("func", "method"), _NOT_BUILDERS) if name in masks else None
        factor = _factor(value, builder) if builder is not None else None
        if builder is None or factor is None:
            continue  # a mask computed with the head count otherwise is no bias folded in
        scaled = f", divided by {1 / factor:g}," if factor not in (None, 1.0) else ""
        st.add(
            known(
                ("attention",),
                "unsupported.alibi_in_mask",
                CODE,
                f"{builder.name} in {st.where(st.backbone)} builds a bias per head ({heads} heads) that the "
                f"backbone folds{scaled} into {name}, which {g.where} passes to its attention kernel: the "
                "kernel adds it to its scores once, inside the mask (not read as ALiBi: a bias research "
                "reads is one the attention adds itself)",
            )
        )
        return


def _mask_argument(kernel: Node) -> Any:
    """The mask a kernel call is given: after the query, key and value, or
    as ``attention_mask=``."""
    at = next(i for i, x in enumerate(kernel.args) if isinstance(x, Node) and x.kind == "instance")
    if len(kernel.args) > at + 4:
        return kernel.args[at + 4]
    return kernel.kwarg("attention_mask")


def _factor(value: Any, builder: Node) -> float | None:
    """The number the bias is multiplied by on its way from ``builder`` into
    the mask (through ``masked_fill``'s filled tensor and reshapes), or None
    when it is combined otherwise."""
    factor = 1.0
    value = strip_casts(value)
    for _ in range(16):
        if value is builder:
            return factor
        if not isinstance(value, Node) or not value.args:
            return None
        short = value.name.rsplit(".", 1)[-1]
        if short == "masked_fill" or (value.kind == "method" and short in _CARRIERS):
            value = strip_casts(value.args[0])
        elif (
            value.kind == "binop"
            and short in ("mul", "div")
            and len(value.args) == 2
            and number(value.args[1])
        ):
            factor = factor * value.args[1] if short == "mul" else factor / value.args[1]
            value = strip_casts(value.args[0])
        else:
            return None
    return None
