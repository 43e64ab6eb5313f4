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
# the attention module attributes holding each size (the first one an attention sets)
ATTRIBUTES = {
    "attention.head_dim": ("head_dim",),
    "attention.num_heads": ("num_heads", "num_attention_heads"),
    "attention.num_kv_heads": ("num_key_value_heads", "num_kv_heads"),
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
    in the first layer are not the config's, or where a head size or count
    the attention modules hold differs between layers (Gemma 4's
    full-attention layers, twice as wide per head as the sliding ones): a
    port reads one size from the config for every layer."""
    found = [dict(layer.children()).get(st.attn_name or "") for layer in st.layers]
    attns = [a for a in found if isinstance(a, Instance)]
    if not attns or len(attns) != len(found):
        return
    widths: dict[tuple, list[int]] = {}
    for index, attn in enumerate(attns):
        shape = tuple(
            (n, c.args.get("out_features"))
            for n, c in attn.children()
            if "." not in n and st.role(c) == "linear"
        )
        widths.setdefault(shape, []).append(index)
    differ = _first_layer_differs(st) or (_varying_sizes(attns) if len(widths) > 1 else [])
    if not differ or len(widths) < 2:
        return
    shown = "; ".join(
        f"{'layer' if len(indices) == 1 else 'layers'} {ranges(indices)}: "
        + ", ".join(f"{n} {w}" for n, w in shape)
        for shape, indices in widths.items()
    )
    st.add(
        known(
            tuple(f for f, _ in differ),
            "unsupported.attention_sizes_per_layer",
            CODE,
            f"{st.where(attns[0])}: projections of other widths in some layers than in others ({shown}); "
            + "; ".join(why for _, why in differ),
        )
    )


def _first_layer_differs(st: AnalyzerState) -> list[tuple[str, str]]:
    """The sizes the first layer's code builds other than the config's."""
    names = [
        name
        for name in SIZES
        if (f := st.result.get(name)) is not None
        and f.known
        and isinstance(st.dims.get(DIMS[name]), int)
        and f.value != st.dims[DIMS[name]]
    ]
    return [(name, f"the first layer's {name} not the config's") for name in names]


def _varying_sizes(attns: list[Instance]) -> list[tuple[str, str]]:
    """The head sizes and counts the attention modules hold (``head_dim``,
    ``num_heads``...) that differ between layers, with their values."""
    out = []
    for name, attrs in ATTRIBUTES.items():
        for attr in attrs:
            values = [a.attrs.get(attr) for a in attns]
            if all(isinstance(v, int) for v in values) and len(set(values)) > 1:
                per = {v: [i for i, w in enumerate(values) if w == v] for v in dict.fromkeys(values)}
                shown = ", ".join(
                    f"{v} on {'layer' if len(i) == 1 else 'layers'} {ranges(i)}" for v, i in per.items()
                )
                out.append((name, f"{attr} {shown}"))
                break
    return out
