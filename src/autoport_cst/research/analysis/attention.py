"""The attention section: the first layer's attention module traced once
(its input projections, reading the layer input, and its output projection,
reading their result), then classified: head counts and head size as the
code builds them, projection biases, fused QKV and its layout, q/k norms
(their width, and whether they normalise the rotated queries and keys), a
norm of the attention output, the attention kind (softmax, differential,
latent), clamped projections, learned parameters beyond projections and
norms, the kernel's keyword arguments (scaling and the config field it comes
from, softcap, sinks) or, for attention written out, the scale of q k^T, the
canonical module names, and the sliding window of every layer."""

from __future__ import annotations

import math
from typing import Any

from autoport_cst.research.analysis import attention_norms as norms
from autoport_cst.research.analysis import (
    latent,
    layer_inputs,
    output_gate,
    qkv_rows,
    query_gate,
    scale_source,
    scores,
    temperature,
    window_source,
)
from autoport_cst.research.analysis.graph import (
    fused_qkv_layout,
    heads_per_group,
    kernel_calls,
    kernel_instance,
    number,
    qkv_roles,
    query_factor,
    ranges,
    unique,
)
from autoport_cst.research.analysis.state import AnalyzerState, AttentionGraph
from autoport_cst.research.findings import CODE, known, unknown
from autoport_cst.research.interp.values import UNKNOWN, Instance, Node, Param
from autoport_cst.research.interp.walk import children_of, depends_on, walk


def analyze(st: AnalyzerState, layer0: Instance) -> AttentionGraph | None:
    """Classify the attention of ``layer0``; its traced graph (for the RoPE
    section), or None when its forward could not be followed."""
    g = _trace(st, layer0)
    if g is None:
        return None
    g = output_gate.split(st, g)
    g = query_gate.split(st, g)
    kernels = kernel_calls(g.attn, g.nodes)
    mla = latent.analyze(st, g, kernels)  # the output projection alone in g.outputs, latent norms
    if mla is not None:
        g = mla.graph
        nh, nkv, hd = st.dims.get("num_heads"), st.dims.get("num_kv_heads"), st.dims.get("head_dim")
    else:
        nh, nkv, hd = _head_counts(st, g)
    _biases(st, g)
    _fused_qkv(st, g, nh, nkv, hd)
    # head_dim as the code computes it
    head_dim = g.attn.attrs.get("head_dim", g.attn.attrs.get("head_size"))
    if isinstance(head_dim, int):
        st.add(known(head_dim, "attention.head_dim", CODE, f"{g.attn.class_name}.head_dim = {head_dim}"))
    qk = norms.qk_and_output_norms(st, g, kernels, mla.norms if mla is not None else [])
    _kind(st, g.attn, g.nodes, g.inputs, g.outputs, kernels, g.where, kind_found=mla is not None)
    norms.qk_norm(st, g, qk, nh, nkv, hd)
    # kernel keyword arguments
    kernel = _kernel_call(g.attn, g.nodes)
    if kernel is None:
        if not scores.analyze(st, g.nodes, g.inputs, g.where, hd):  # else unscaled: no field to read
            scale_source.written_out(st, g.attn, g.where, hd)
    elif mla is not None and mla.query_head_dim is not None:
        _kernel_arguments(st, g.attn, kernel, g.where, mla.query_head_dim)
        _latent_scale(st, kernel, g.where, mla.query_head_dim)
    else:
        _kernel_arguments(st, g.attn, kernel, g.where, hd, query_factor(kernel, g.inputs))
    _names(st, g.nodes, g.inputs, g.in_insts, g.out_insts, kernel)
    norms.value_norm(st, g)
    _per_layer(st, g.where)
    return g


def _fullest_path(st: AnalyzerState, outs: list[Any]) -> Any:
    """The first forward output calling the most projections: a path taking
    keys and values from a cache (a cross-attention's, BART-style) calls
    fewer and shows no k/v projection."""

    def projections(value: Any) -> int:
        return len({id(n.ref) for n in walk(value) if n.kind == "module" and st.role(n.ref) == "linear"})

    counts = [projections(value) for value in outs]
    return outs[counts.index(max(counts))]


def _trace(st: AnalyzerState, layer0: Instance) -> AttentionGraph | None:
    """The attention's first forward output, its input projections (calls
    not reading another projection) and output projections."""
    attn = dict(layer0.children())[st.attn_name]
    where = st.where(attn)
    prefix = f"{st.layer_prefix}0.{st.attn_path or st.attn_name}."
    outs = _traced_outputs(st, attn)
    if not outs:
        st.add(unknown("attention.qkv_bias", CODE, f"{where}: forward could not be followed"))
        return None
    out = _fullest_path(st, outs)
    nodes = list(walk(out))
    linear_calls = [
        n for n in nodes if n.kind == "module" and n.ref is not None and st.role(n.ref) == "linear"
    ]
    inputs, outputs = [], []
    for call in linear_calls:
        arg = call.args[0] if call.args else None
        if any(depends_on(arg, other) for other in linear_calls if other is not call):
            outputs.append(call)
        else:
            inputs.append(call)
    order = list(attn.attrs)
    in_insts = sorted(
        unique([c.ref for c in inputs]), key=lambda i: order.index(i.name) if i.name in order else 99
    )
    out_insts = unique([c.ref for c in outputs])
    st.result.qkv_modules = [prefix + (i.name or "?") for i in in_insts]
    st.result.o_module = prefix + (out_insts[0].name or "?") if len(out_insts) == 1 else None
    return AttentionGraph(attn, where, nodes, inputs, outputs, in_insts, out_insts)


def _traced_outputs(st: AnalyzerState, attn: Instance) -> list[Any]:
    """The attention's forward outputs; for an attention calling no kernel,
    traced with what its layer passes it when that binds arguments to
    ``None`` (Falcon's ``alibi``, withheld when the config has no ALiBi:
    the rotary branch with its scores written out, not the ALiBi one)."""
    outs = st.outputs(attn)
    if any(kernel_calls(attn, list(walk(value))) for value in outs):
        return outs
    bound = layer_inputs.attention_outputs(st, 0)
    return bound or outs


def _head_counts(st: AnalyzerState, g: AttentionGraph) -> tuple[Any, Any, Any]:
    """Heads, KV heads and head size: the config's, unless the projection
    widths the code builds say otherwise."""
    where, in_insts, out_insts = g.where, g.in_insts, g.out_insts
    nh, nkv, hd = st.dims.get("num_heads"), st.dims.get("num_kv_heads"), st.dims.get("head_dim")
    code_hd = g.attn.attrs.get("head_dim", g.attn.attrs.get("head_size"))
    if isinstance(code_hd, int):
        hd = code_hd
    widths = [i.args.get("out_features") for i in in_insts]
    total = sum(w for w in widths if isinstance(w, int)) - g.gate_rows
    q_width = out_insts[0].args.get("in_features") if len(out_insts) == 1 else None
    if (
        isinstance(hd, int)
        and hd
        and isinstance(q_width, int)
        and all(isinstance(w, int) for w in widths)
        and widths
        and q_width % hd == 0
        and (total - q_width) % (2 * hd) == 0
        and total > q_width  # a layer that reads its keys and values from another builds no KV projection
    ):
        nh, nkv = q_width // hd, (total - q_width) // (2 * hd)
        gated = f" (less {g.gate_rows} output gate rows)" if g.gate_rows else ""
        st.add(
            known(
                nh,
                "attention.num_heads",
                CODE,
                f"{where}: output projection reads {q_width} = {nh} heads x {hd}",
            )
        )
        st.add(
            known(
                nkv,
                "attention.num_kv_heads",
                CODE,
                f"{where}: input projections {widths}{gated} = q {q_width} + 2 x {nkv} KV heads x {hd}",
            )
        )
        _kv_repeat(st, g, nh, nkv)
    return nh, nkv, hd


def _kv_repeat(st: AnalyzerState, g: AttentionGraph, nh: int, nkv: int) -> None:
    """The attention functions repeat each KV head ``num_key_value_groups``
    times (``repeat_kv(key, module.num_key_value_groups)``): a module that
    sets it to another number than query heads / KV heads its projections
    build gives the kernel keys that do not match the queries (Falcon 5.25
    without multi-query: ``num_heads // num_kv_heads``, while the fused
    projection builds a KV head per query head).

    Projections that build more KV heads than query heads are no grouped
    attention at all (no repeat count fits; transformers' own attention
    repeats each KV head zero times): not a model, which only a varied
    config makes (config dependence doubling Nemotron's num_key_value_heads
    from the 4 of its 4 query heads), so nothing is read of it here; the
    KV head count stays a size the port reads from the config."""
    groups = g.attn.attrs.get("num_key_value_groups")
    if not isinstance(groups, int) or isinstance(groups, bool) or not nkv or nkv > nh or groups * nkv == nh:
        return
    st.add(
        known(
            ("attention",),
            "unsupported.kv_repeat",
            CODE,
            f"{g.where}: {g.attn.class_name}.num_key_value_groups = {groups}, the times the attention "
            f"functions repeat each KV head, where its projections build {nkv} KV heads for {nh} query heads",
        )
    )


def _describe(in_insts: list[Instance]) -> str:
    return ", ".join(
        f"{i.name}(out={i.args.get('out_features')}, bias={i.args.get('bias')})" for i in in_insts
    )


def _biases(st: AnalyzerState, g: AttentionGraph) -> None:
    where, in_insts, out_insts = g.where, g.in_insts, g.out_insts
    desc = _describe(in_insts)
    biases = {i.args.get("bias") for i in in_insts}
    if not in_insts:
        st.add(unknown("attention.qkv_bias", CODE, f"{where}: no input projection found"))
    elif len(biases) == 1 and biases <= {True, False}:
        st.add(known(biases.pop(), "attention.qkv_bias", CODE, f"{where}: {desc}"))
    else:
        st.add(unknown("attention.qkv_bias", CODE, f"{where}: projections disagree: {desc}"))
    if len(out_insts) == 1 and out_insts[0].args.get("bias") in (True, False):
        o = out_insts[0]
        st.add(
            known(
                o.args["bias"],
                "attention.o_bias",
                CODE,
                f"{where}: output projection {o.name}(bias={o.args['bias']})",
            )
        )
    else:
        st.add(unknown("attention.o_bias", CODE, f"{where}: {len(out_insts)} output projections"))


def _fused_qkv(st: AnalyzerState, g: AttentionGraph, nh: Any, nkv: Any, hd: Any) -> None:
    """One input projection of width (heads + 2 KV heads) x head_dim, and
    how its output is split; or three separate projections."""
    where, in_insts = g.where, g.in_insts
    if len(in_insts) == 1 and isinstance(nh, int) and isinstance(nkv, int) and isinstance(hd, int):
        width = in_insts[0].args.get("out_features")
        evidence = (
            f"{where}: one input projection {in_insts[0].name} of width {width}"
            f" ((heads + 2 kv heads) x head_dim = {(nh + 2 * nkv) * hd})"
        )
        if width == (nh + 2 * nkv) * hd:
            st.add(known(True, "code.fused_qkv", CODE, evidence))
            probed = qkv_rows.layout(st, g.attn, g.nodes, g.inputs[0], nh, nkv, hd)
            if probed is not None:
                _probed_layout(st, g, probed)
                return
            layout, grouped = fused_qkv_layout(st.outputs(g.attn), g.attn, g.nodes, g.inputs[0], width, hd)
            if grouped is not None:
                groups, order = grouped
                st.add(known(groups, "code.qkv_groups", CODE, f"{where}: {groups} groups of [{order}] rows"))
                st.add(
                    known(order, "code.qkv_order", CODE, f"{where}: each group's rows in the order {order}")
                )
            st.add(known(layout, "code.qkv_layout", CODE, f"{where}: how the fused output is split"))
            if layout == "concatenated" and (per_group := heads_per_group(g.nodes, g.inputs[0], width, hd)):
                st.add(
                    known(
                        ("checkpoint",),
                        "unsupported.qkv_head_groups",
                        CODE,
                        f"{where}: {in_insts[0].name}'s output viewed as groups of {per_group} heads "
                        f"({per_group - 2} query heads, a key and a value head per group)",
                    )
                )
        else:
            st.add(unknown("code.fused_qkv", CODE, evidence))
    elif len(in_insts) == 3:
        st.add(known(False, "code.fused_qkv", CODE, f"{where}: separate projections {_describe(in_insts)}"))


def _probed_layout(st: AnalyzerState, g: AttentionGraph, probed: tuple[str, int | None]) -> None:
    """The fused projection's layout as :func:`.qkv_rows.layout` read it from
    the rows each head reads (``kv_groups``: a group per KV head, its query
    heads, a key and a value head)."""
    layout, per_group = probed
    name = g.in_insts[0].name
    rows = {
        "concatenated": "the query heads' rows, then the keys', then the values'",
        "per_head_interleaved": "each head's query, key and value rows in turn",
        "kv_groups": f"groups of {per_group} heads ({(per_group or 2) - 2} query heads, a key and a value head)",
    }
    evidence = f"{g.where}: the attention reads {rows[layout]} of {name}'s output (its split run on the rows)"
    st.add(known(layout, "code.qkv_layout", CODE, evidence))


def _names(
    st: AnalyzerState,
    nodes: list[Node],
    inputs: list[Node],
    in_insts: list[Instance],
    out_insts: list[Instance],
    kernel: Node | None,
) -> None:
    """Canonical names of the attention's modules: which input projection
    produces the queries, keys and values (the kernel's query, key and
    value arguments, or the operands of the products of attention written
    out), the output projection, and the q/k norms."""
    names = st.result.module_names
    base = st.attn_path or st.attn_name
    names["self_attn"] = base
    for inst in in_insts + out_insts:
        st.result.linear_modules.append(st.base_module(inst) or "?")
    if len(out_insts) == 1 and out_insts[0].name:
        names["self_attn.o_proj"] = f"{base}.{out_insts[0].name}"
    if len(in_insts) == 1 and in_insts[0].name:
        names["self_attn.qkv_proj"] = f"{base}.{in_insts[0].name}"
    roles: dict[str, Instance] = {}
    if len(in_insts) == 3:
        if kernel is not None:
            roles = qkv_roles(st.outputs(kernel_instance(kernel)), kernel, in_insts)
        else:  # attention written out: the operands of its two products
            roles = scores.roles(nodes, inputs)
        if len({id(v) for v in roles.values()}) != 3:
            # declaration order, a projection holding the queries' output gate first (query_gate)
            gated = [i for i in in_insts if names.get("self_attn.gate_proj") == f"{base}.{i.name}"]
            ordered = gated + [i for i in in_insts if not any(i is x for x in gated)]
            roles = dict(zip(("q_proj", "k_proj", "v_proj"), ordered, strict=False))
        for role, inst in roles.items():
            if inst.name:
                names[f"self_attn.{role}"] = f"{base}.{inst.name}"
    for n in nodes:
        if n.kind == "module" and n.ref is not None and st.role(n.ref) == "norm" and n.args and n.ref.name:
            if not st.norm_info(n.ref)["affine"]:
                continue  # no weight: nothing a port loads under its name
            normed = norms.unrotated(st, n.args[0])
            for role, proj in (("q_norm", roles.get("q_proj")), ("k_norm", roles.get("k_proj"))):
                if proj is not None and any(depends_on(normed, c) for c in inputs if c.ref is proj):
                    names[f"self_attn.{role}"] = f"{base}.{n.ref.name}"


# shape-keeping steps between a q/k view and the norm that reads it


def _kernel_call(attn: Instance, nodes: list[Node]) -> Node | None:
    calls = kernel_calls(attn, nodes)
    return calls[0] if calls else None


def _kind(
    st: AnalyzerState,
    attn: Instance,
    nodes: list[Node],
    inputs: list[Node],
    outputs: list[Node],
    kernels: list[Node],
    where: str,
    kind_found: bool = False,
) -> None:
    """softmax (one kernel call on projections of the layer input),
    differential (the kernel called twice and the results combined) or
    latent (queries, keys or values from a projection of another
    projection; found by :mod:`.latent` when ``kind_found``); and learned
    parameters of the attention module that its computation uses beyond
    the projections, norms and sinks."""
    kind, evidence = "softmax", "one attention over projections of the layer input"
    if len(kernels) > 1:
        kind, evidence = "differential", f"the attention kernel is called {len(kernels)} times and combined"
    elif kernels and len(kernels[0].args) >= 4:
        chained = unique([c.ref for c in outputs if any(depends_on(arg, c) for arg in kernels[0].args[1:4])])
        if chained:
            kind = "latent"
            evidence = (
                f"queries/keys/values come from {', '.join(c.name or '?' for c in chained)}, "
                "projections of other projections (low-rank latent attention)"
            )
    if not kind_found:
        st.add(known(kind, "attention.kind", CODE, f"{where}: {evidence}"))
    clipped = [
        n
        for n in nodes
        if n.kind in ("method", "call")
        and n.args
        and n.name.rsplit(".", 1)[-1] in ("clamp", "clamp_", "clip", "clip_")
        and any(depends_on(n.args[0], c) for c in inputs)
        and not any(depends_on(n.args[0], k) for k in kernels)
    ]
    if clipped:
        st.add(
            known(
                True,
                "code.qkv_clip",
                CODE,
                f"{where}: the projections are clamped before the attention ({clipped[0].name})",
            )
        )
    _own_parameters(st, attn, nodes, kernels, where)


def _own_parameters(
    st: AnalyzerState, attn: Instance, nodes: list[Node], kernels: list[Node], where: str
) -> None:
    """Learned parameters of the attention module its computation uses
    (beyond its submodules' and the sinks passed to the kernel)."""
    sinks = {id(v.ref) for k in kernels for _, v in k.kwargs if isinstance(v, Node) and v.kind == "param"}
    own = [
        n
        for n in nodes
        if n.kind == "param"
        and isinstance(n.ref, Param)
        and id(n.ref) not in sinks
        and any(n.ref is p for _, p in attn.params())
    ]
    names = sorted({name for name, p in attn.params() if any(p is n.ref for n in own)})
    if names:
        st.add(
            known(
                names,
                "code.attention_parameters",
                CODE,
                f"{where}: the attention computation uses the parameters {', '.join(names)}",
            )
        )


def _input_scaling(st: AnalyzerState, attn: Instance, nodes: list[Node]) -> temperature.Scaling | None:
    """Queries or keys multiplied (or divided), between their projection and
    the attention, by a value computed from another input of the attention's
    forward than the hidden states and the rotation's (Ministral 3, Llama 4:
    ``1 + beta * log(1 + floor(position / n))``, a scale that grows with the
    position), or None.
    ``temperature`` reads its constants."""
    projections = [
        n for n in nodes if n.kind == "module" and n.ref is not None and st.role(n.ref) == "linear"
    ]
    qk = _query_key_arguments(attn, nodes, projections)
    rotation_inputs = {
        id(n) for r in nodes if st.is_rotation(r) for n in walk(list(r.args)) if n.kind == "input"
    }
    for node in walk(qk):
        if node.kind != "binop" or node.name not in ("mul", "div") or len(node.args) != 2:
            continue
        sides = [any(n in projections for n in _values_read(a)) for a in node.args]
        if sides.count(True) != 1:
            continue
        other = node.args[sides.index(False)]
        read = sorted(
            {n.name for n in _values_read(other) if n.kind == "input" and id(n) not in rotation_inputs}
        )
        if read:
            return temperature.Scaling(node.name, other, tuple(read))
    return None


_METADATA = {"dtype", "device", "shape"}


def _values_read(value: Any) -> list[Node]:
    """The nodes whose values ``value`` is computed from: not those only
    asked for their dtype, device or shape (``x.to(q.dtype)``)."""
    out: list[Node] = []
    seen: set[int] = set()
    stack = [value]
    while stack:
        current = stack.pop()
        if isinstance(current, Node):
            if id(current) in seen:
                continue
            seen.add(id(current))
            if (current.kind == "attr" and current.name in _METADATA) or (
                current.kind == "method" and current.name == "size"
            ):
                continue
            out.append(current)
            stack.extend(children_of(current))
        elif isinstance(current, (tuple, list, dict)):
            stack.extend(children_of(current))
    return out


def _query_key_arguments(attn: Instance, nodes: list[Node], projections: list[Node]) -> list[Any]:
    """The queries and keys the attention consumes: the kernel's, or the
    operands of the written-out q @ k^T."""
    kernels = kernel_calls(attn, nodes)
    if kernels:
        args = list(kernels[0].args)
        at = next(
            i for i, a in enumerate(args) if isinstance(a, Node) and a.kind == "instance" and a.ref is attn
        )
        return args[at + 1 : at + 3]  # attention_interface(self, query, key, value, ...)
    for n in nodes:
        if (
            n.kind == "call"
            and n.name.endswith("matmul")
            and len(n.args) == 2
            and all(any(depends_on(a, c) for c in projections) for a in n.args)
        ):
            return list(n.args)
    return []


def _kernel_arguments(
    st: AnalyzerState, attn: Instance, kernel: Node, where: str, hd: Any, query_scale: float = 1.0
) -> None:
    kwargs = dict(kernel.kwargs)
    scaling = kwargs.get("scaling", None)
    if number(scaling) and query_scale != 1.0:
        scaling = scaling * query_scale  # the queries scaled before the kernel
    if "scaling" not in kwargs:
        st.add(known(None, "attention.scale", CODE, f"{where}: no scaling argument (kernel default)"))
    elif number(scaling) and isinstance(hd, int):
        default = hd**-0.5
        if math.isclose(scaling, default, rel_tol=1e-9):
            st.add(known(None, "attention.scale", CODE, f"{where}: scaling = head_dim ** -0.5"))
            scale_source.default_scale(st, attn, float(scaling), where)
        else:
            st.add(
                known(
                    float(scaling),
                    "attention.scale",
                    CODE,
                    f"{where}: scaling = {scaling:g} (head_dim ** -0.5 would be {default:g})",
                )
            )
            scale_source.from_scale(st, attn, float(scaling), where, hd)
    else:
        st.add(unknown("attention.scale", CODE, f"{where}: scaling not computable from the config"))
    softcap = kwargs.get("softcap", None)
    if softcap is None or number(softcap):
        st.add(
            known(
                float(softcap) if softcap is not None else None,
                "attention.softcap",
                CODE,
                f"{where}: softcap={softcap!r}",
            )
        )
    else:
        st.add(unknown("attention.softcap", CODE, f"{where}: softcap not computable"))
    sinks = [k for k, v in kernel.kwargs if isinstance(v, Node) and v.kind == "param"]
    if sinks:
        names = ", ".join(f"{k}=self.{dict(kernel.kwargs)[k].name}" for k in sinks)
        st.add(
            known(
                True,
                "attention.sinks",
                CODE,
                f"{where}: learned per-head logits passed to the kernel ({names})",
            )
        )
        st.result.sink_keys = [
            f"{st.layer_prefix}0.{st.attn_name}.{dict(kernel.kwargs)[k].name}" for k in sinks
        ]
    else:
        st.add(known(False, "attention.sinks", CODE, f"{where}: no parameter passed to the kernel"))


def _latent_scale(st: AnalyzerState, kernel: Node, where: str, query_head_dim: int) -> None:
    """A latent attention's scale: ``query_head_dim ** -0.5`` times YaRN's
    ``mscale(factor, mscale_all_dim) ** 2`` when the RoPE sets it is its
    default (what the spec's latent kind computes), so no scale field."""
    factor = latent.yarn_scale_factor(st.interp.config)
    scaling = dict(kernel.kwargs).get("scaling", None)
    if factor == 1.0 or not number(scaling):
        return
    if math.isclose(scaling, query_head_dim**-0.5 * factor, rel_tol=1e-6):
        evidence = (
            f"{where}: scaling = (qk_nope_head_dim + qk_rope_head_dim) ** -0.5 x mscale(factor, "
            f"mscale_all_dim) ** 2 = {query_head_dim} ** -0.5 x {factor:g}"
        )
        st.add(known(None, "attention.scale", CODE, evidence))
        st.add(known(None, "attention.scale_key", CODE, evidence))


def _per_layer(st: AnalyzerState, where: str) -> None:
    """Sliding window per layer: the kernel's ``sliding_window`` argument
    evaluated for every layer's attention module. Records, per layer whose
    attention forward was traced, whether it applies a rotation (for the
    RoPE section)."""
    windows: list[Any] = []
    rotary = []
    scaled: list[
        tuple[Instance, temperature.Scaling | None]
    ] = []  # per traced layer: a position-dependent query scale
    sinks: list[bool] = []  # per traced layer: a learned parameter passed to its kernel
    normed: list[bool] = []  # per traced layer: does it apply the q/k norms
    qk_names = {name.rsplit(".", 1)[-1] for name in st.result.qk_norm_modules}
    for index, layer in enumerate(st.layers):
        attn = dict(layer.children()).get(st.attn_name)
        if attn is None:
            windows.append(UNKNOWN)
            continue
        outs = layer_inputs.attention_outputs(st, index)  # with what its layer is passed
        if not outs:
            windows.append(UNKNOWN)
            continue
        nodes = list(walk(outs[0]))
        kernel = _kernel_call(attn, nodes)
        if kernel is not None:
            value = dict(kernel.kwargs).get("sliding_window", None)
        else:
            value = scores.window(st, index, nodes)
        windows.append(value)
        sinks.append(
            kernel is not None and any(isinstance(v, Node) and v.kind == "param" for _, v in kernel.kwargs)
        )
        rotary.append(any(n.kind == "func" for n in nodes if st.is_rotation(n)))
        normed.append(any(n.kind == "module" and n.ref is not None and n.ref.name in qk_names for n in nodes))
        scaled.append((attn, _input_scaling(st, attn, nodes)))
    st.layer_rotation = rotary
    norms.qk_norm_layers(st, rotary, normed, where)
    temperature.refuse_or_read(st, scaled)
    if any(sinks) and not all(sinks):
        on = [i for i, x in enumerate(sinks) if x]
        st.add(unknown("attention.sinks", CODE, f"{where}: attention sinks on layers {ranges(on)} only"))
    _window_findings(st, windows, where)
    if not any(w is UNKNOWN for w in windows):
        window_source.check(st, windows, where)


def _window_findings(st: AnalyzerState, windows: list[Any], where: str) -> None:
    """The sliding window from the kernel's argument on every layer: none,
    all, per layer, or unknown where one is not computable; its length when
    the layers that have one agree."""
    if any(w is UNKNOWN or not (w is None or number(w)) for w in windows):
        st.add(
            unknown(
                "attention.sliding_window",
                CODE,
                f"{where}: sliding_window argument not computable for every layer",
            )
        )
    else:
        on = [w is not None and w > 0 for w in windows]
        if not any(on):
            st.add(
                known("none", "attention.sliding_window", CODE, f"{where}: no sliding window on any layer")
            )
        elif all(on):
            st.add(
                known(
                    "all",
                    "attention.sliding_window",
                    CODE,
                    f"{where}: sliding_window={windows[0]} on every layer",
                )
            )
        else:
            layers = [i for i, o in enumerate(on) if o]
            st.add(
                known(
                    "per_layer",
                    "attention.sliding_window",
                    CODE,
                    f"{where}: sliding window on layers {ranges(layers)} of {len(on)}",
                )
            )
        sizes = {w for w in windows if w}
        if len(sizes) == 1:
            st.add(known(int(sizes.pop()), "attention.sliding_window_size", CODE, f"{where}: window length"))
