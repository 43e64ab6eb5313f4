"""A causal LM that runs its decoder on another model's states, named from
its code: its forward gives the backbone no token ids, only a projection of
the embeddings the caller passes (the Gemma 4 assistant, a drafter for
assisted decoding: ``pre_projection`` of ``inputs_embeds``, twice the main
model's hidden size, and the main model's keys and values,
``shared_kv_states``). No reference embeds tokens it is not given; the
embedding section, read from the first layer's input, follows from it."""

from __future__ import annotations

from autoport_cst.research.analysis.state import AnalyzerState
from autoport_cst.research.findings import CODE, known
from autoport_cst.research.interp.values import Node
from autoport_cst.research.interp.walk import walk

# what every backbone is given beside its input, left out of the evidence
COMMON = ("attention_mask", "position_ids", "cache", "past_key_values", "cache_position", "use_cache")


def external_inputs(st: AnalyzerState) -> bool:
    """Name the causal LM's forward calling the backbone with
    ``input_ids=None`` and ``inputs_embeds`` a linear layer of the causal LM
    applied to its own ``inputs_embeds`` argument; True when named."""
    backbone = st.backbone
    linears = {id(c): n for n, c in st.top.children() if "." not in n and st.role(c) == "linear"}
    if backbone is None:
        return False
    for state in st.forward(st.top):
        for call in walk(state.value):
            if call.kind != "module" or call.ref is not backbone:
                continue
            given = dict(call.kwargs)
            embeds = given.get("inputs_embeds")
            if "input_ids" not in given or given["input_ids"] is not None or not isinstance(embeds, Node):
                continue
            projection = next(
                (n for n in walk(embeds) if n.kind == "module" and id(n.ref) in linears and n.args), None
            )
            if projection is None or not any(n.kind == "input" for n in walk(projection.args[0])):
                continue
            sizes = f"{projection.ref.args.get('in_features')} -> {projection.ref.args.get('out_features')}"
            others = sorted(
                k for k, v in given.items() if k not in ("inputs_embeds", "input_ids", *COMMON) and _input(v)
            )
            passed = f"; it also passes the caller's {', '.join(others)}" if others else ""
            st.add(
                known(
                    ("embedding",),
                    "unsupported.external_inputs",
                    CODE,
                    f"{st.where(st.top)} gives {backbone.class_name} no token ids: its input is "
                    f"{linears[id(projection.ref)]} ({sizes}) of the inputs_embeds the caller passes{passed}",
                )
            )
            return True
    return False


def _input(value: object) -> bool:
    """``value`` is something the causal LM computes or is given (not a
    constant: ``use_cache=False``)."""
    return value is not None and not isinstance(value, (bool, int, float, str))
