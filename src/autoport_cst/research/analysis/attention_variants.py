"""What an attention computes beyond the fields of the attention section,
named from its code: a learned bias over query-key positions computed from a
projection of the hidden states and handed to the attention kernel
(Inkling's ``r_proj`` and ``InklingRelativeLogits``, the kernel's
``position_bias``), and attention projections of other widths in some
layers than in others (Inkling's sliding layers, sized by
``swa_num_attention_heads`` and ``swa_head_dim``, not by the fields a port
reads).

Each is an ``unsupported.<name>`` finding whose value is the spec fields it
explains: the sizes research then reads from the code other than the
config's follow from it, and the refusal names the computation instead."""

from __future__ import annotations

from autoport_cst.research.analysis.graph import kernel_calls, ranges
from autoport_cst.research.analysis.state import AnalyzerState, AttentionGraph
from autoport_cst.research.findings import CODE, known
from autoport_cst.research.interp.values import Instance
from autoport_cst.research.interp.walk import walk

SIZES = ("attention.num_heads", "attention.num_kv_heads", "attention.head_dim")
# the dimensions of the config analysis each size is compared with
DIMS = {
    "attention.num_heads": "num_heads",
    "attention.num_kv_heads": "num_kv_heads",
    "attention.head_dim": "head_dim",
}
# roles of the attention's children that the attention section reads
READ = ("linear", "norm", "rotary", "dropout", "activation")


def relative_position_bias(st: AnalyzerState, g: AttentionGraph) -> None:
    """A kernel argument computed by a child module of the attention from a
    projection of the hidden states and from the positions (``arange``): a
    learned bias over query-key positions added to the scores. It explains
    the KV head count when its projection was counted with q, k and v."""
    linears = {id(c): n for n, c in g.attn.children() if "." not in n and st.role(c) == "linear"}
    for kernel in kernel_calls(g.attn, g.nodes):
        for key, value in kernel.kwargs:
            for call in walk(value):
                if call.kind != "module" or st.role(call.ref) in READ or call.ref is g.attn:
                    continue
                inputs = [*call.args, *(v for _, v in call.kwargs)]
                projections = [
                    linears[id(n.ref)]
                    for a in inputs
                    for n in walk(a)
                    if n.kind == "module" and id(n.ref) in linears
                ]
                positioned = any(n.name.rsplit(".", 1)[-1] == "arange" for a in inputs for n in walk(a))
                if not projections or not positioned:
                    continue
                counted = any(p.name == projections[0] for p in g.in_insts if p.name)
                st.add(
                    known(
                        ("attention.num_kv_heads",) if counted else True,
                        "unsupported.relative_position_bias",
                        CODE,
                        f"{g.where}: {call.ref.name} ({call.ref.class_name}) computes from {projections[0]}, a "
                        f"projection of the hidden states, and the query and key positions a bias the attention "
                        f"kernel adds to its scores ({key})",
                    )
                )
                return


def sizes_per_layer(st: AnalyzerState) -> None:
    """Attention projections of other widths in some decoder layers than in
    others, named with the layers of each, where the sizes the code builds
    in the first layer are not the config's (a port reads one size from the
    config for every layer)."""
    differ = [
        name
        for name in SIZES
        if (f := st.result.get(name)) is not None
        and f.known
        and isinstance(st.dims.get(DIMS[name]), int)
        and f.value != st.dims[DIMS[name]]
    ]
    if not differ:
        return
    widths: dict[tuple, list[int]] = {}
    first: Instance | None = None
    for index, layer in enumerate(st.layers):
        attn = dict(layer.children()).get(st.attn_name or "")
        if not isinstance(attn, Instance):
            return
        first = first or attn
        shape = tuple(
            (n, c.args.get("out_features"))
            for n, c in attn.children()
            if "." not in n and st.role(c) == "linear"
        )
        widths.setdefault(shape, []).append(index)
    if len(widths) < 2 or first is None:
        return
    shown = "; ".join(
        f"{'layer' if len(indices) == 1 else 'layers'} {ranges(indices)}: "
        + ", ".join(f"{n} {w}" for n, w in shape)
        for shape, indices in widths.items()
    )
    st.add(
        known(
            tuple(differ),
            "unsupported.attention_sizes_per_layer",
            CODE,
            f"{st.where(first)}: projections of other widths in some layers than in others ({shown}); "
            f"the first layer's {', '.join(differ)} not the config's",
        )
    )
