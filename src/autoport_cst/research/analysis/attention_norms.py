"""The attention's norms, as the attention section reads them: q/k norms
(their width, per head or full width, affine or not, and whether they
normalise the rotated queries and keys, on which layers), a norm of the
attention output, and a norm of the values."""

from __future__ import annotations

from typing import Any

from autoport_cst.research.analysis.graph import first_int, ranges, unique
from autoport_cst.research.analysis.state import AnalyzerState, AttentionGraph
from autoport_cst.research.findings import CODE, known, unknown
from autoport_cst.research.interp.values import Instance, Node
from autoport_cst.research.interp.walk import depends_on


def qk_and_output_norms(
    st: AnalyzerState, g: AttentionGraph, kernels: list[Node], latent_norms: list[Instance]
) -> list[Instance]:
    """q/k norms: norms applied to a projection before the scores (and
    whether they read the rotated q or k), not the norms of a latent
    attention's latents (``latent_norms``); a norm of the attention's result
    before the output projection is an output norm. Returns the q/k norms."""
    where, nodes = g.where, g.nodes
    mixers = kernels + [
        n
        for n in nodes
        if n.kind in ("call", "method")
        and n.name.rsplit(".", 1)[-1] in ("softmax", "scaled_dot_product_attention")
    ]
    qk, after, rotated_after = [], [], []
    rotations = [r for r in nodes if st.is_rotation(r)]
    for n in nodes:
        if n.kind == "module" and n.ref is not None and st.role(n.ref) == "norm":
            if any(n.ref is x for x in latent_norms):
                continue
            arg = n.args[0] if n.args else None
            if any(depends_on(arg, m) for m in mixers):
                after.append(n)
            elif any(depends_on(arg, c) for c in g.inputs):
                qk.append(n.ref)
                if any(depends_on(r, n) for r in rotations):
                    rotated_after.append(n.ref.name or "?")
                if any(depends_on(arg, r) for r in rotations):
                    st.add(
                        known(
                            "after_rope",
                            "attention.qk_norm_position",
                            CODE,
                            f"{where}: {n.ref.name} normalises the rotated {n.ref.name[:1]} (after RoPE)",
                        )
                    )
    qk = unique(qk)
    _before_rope(st, where, rotated_after)
    out_norms = unique(
        [n.ref for n in after if any(depends_on(o.args[0] if o.args else None, n) for o in g.outputs)]
    )
    if out_norms:
        st.add(
            known(
                True,
                "attention.output_norm",
                CODE,
                f"{where}: {', '.join(q.name or '?' for q in out_norms)} normalises the attention "
                "output before the output projection",
            )
        )
    else:
        st.add(
            known(
                False,
                "attention.output_norm",
                CODE,
                f"{where}: the output projection reads the attention output directly",
            )
        )
    return qk


def _before_rope(st: AnalyzerState, where: str, rotated_after: list[str]) -> None:
    """q/k norms whose output the rotation reads (and none that reads a
    rotated query or key): ``before_rope`` as read, not as the default."""
    position = st.result.get("attention.qk_norm_position")
    if not rotated_after or (position is not None and position.value == "after_rope"):
        return
    st.add(
        known(
            "before_rope",
            "attention.qk_norm_position",
            CODE,
            f"{where}: RoPE rotates the output of {', '.join(dict.fromkeys(rotated_after))} (before RoPE)",
        )
    )


def qk_norm(st: AnalyzerState, g: AttentionGraph, qk: list[Instance], nh: Any, nkv: Any, hd: Any) -> None:
    """The q/k norms' width (per head or full width) and kind."""
    where = g.where
    st.result.qk_norm_modules = [f"{st.layer_prefix}0.{st.attn_name}." + (q.name or "?") for q in qk]
    if not qk:
        st.add(known("none", "attention.qk_norm", CODE, f"{where}: no norm applied to queries or keys"))
        return
    widths = {_norm_width(st, q) or _applied_width(st, g, q) for q in qk}
    kinds = {st.norm_info(q)["kind"] or _child_norm_kind(st, q) for q in qk}
    if not any(st.norm_info(q)["affine"] for q in qk):
        st.add(
            known(False, "attention.qk_norm_affine", CODE, f"{where}: the q/k norms have no learned weight")
        )
    if widths == {hd}:
        verdict = "per_head"
    elif isinstance(nh, int) and isinstance(hd, int) and widths <= {nh * hd, (nkv or 0) * hd} and widths:
        verdict = "full_width"
    else:
        verdict = None
    names = ", ".join(f"{q.name}(width {_norm_width(st, q) or _applied_width(st, g, q)})" for q in qk)
    if verdict is None:
        st.add(unknown("attention.qk_norm", CODE, f"{where}: q/k norms {names}, width not classified"))
    else:
        st.add(known(verdict, "attention.qk_norm", CODE, f"{where}: {names} applied to the projections"))
    _qk_norm_weight(st, qk, where)
    if kinds and kinds != {"rmsnorm"}:
        st.add(
            known(
                sorted(k or "unknown" for k in kinds)[0],
                "code.qk_norm_kind",
                CODE,
                f"{where}: q/k norm computes {kinds}",
            )
        )
        biases = {st.norm_info(q)["bias"] for q in qk}
        if len(biases) == 1 and None not in biases:
            bias = bool(biases.pop())
            st.add(
                known(
                    bias,
                    "code.qk_norm_bias",
                    CODE,
                    f"{where}: q/k norms {'with' if bias else 'without'} bias",
                )
            )
    _fused_qk_norm_names(st, g, qk)


def _fused_qk_norm_names(st: AnalyzerState, g: AttentionGraph, qk: list[Instance]) -> None:
    """Which q/k norm normalises the queries and which the keys, when one
    fused projection makes both (Persimmon's ``q_layernorm`` and
    ``k_layernorm`` of ``query_key_value``'s slices): the one whose output
    the rotation's first argument (the query, ``apply_rotary_pos_emb(q, k,
    ...)``) reads and its second does not, and the other way round.
    Separate projections are named by the attention's names."""
    if len(g.in_insts) != 1 or len(qk) != 2:
        return
    rotations = [r for r in g.nodes if st.is_rotation(r) and len(r.args) >= 2]
    if len(rotations) != 1:
        return
    query, key = rotations[0].args[0], rotations[0].args[1]
    names = st.result.module_names
    for n in g.nodes:
        if not (n.kind == "module" and n.ref is not None and any(n.ref is q for q in qk) and n.ref.name):
            continue
        if not st.norm_info(n.ref)["affine"]:
            continue  # no weight: nothing a port loads under its name
        into_q, into_k = depends_on(query, n), depends_on(key, n)
        if into_q != into_k:
            names.setdefault(f"self_attn.{'q_norm' if into_q else 'k_norm'}", f"{st.attn_name}.{n.ref.name}")


def _qk_norm_weight(st: AnalyzerState, qk: list[Instance], where: str) -> None:
    """How the q/k norms apply their learned weight: ``x * weight`` or
    ``x * (1 + weight)`` (``code.qk_norm_unit_offset``; a port applies the
    layer norms' form, decide/unsupported compares them)."""
    offsets = {st.norm_info(q)["unit_offset"] for q in qk if st.norm_info(q)["affine"]}
    if len(offsets) != 1 or None in offsets:
        return
    offset = bool(offsets.pop())
    st.add(
        known(
            offset,
            "code.qk_norm_unit_offset",
            CODE,
            f"{where}: the q/k norms scale by {'(1 + weight)' if offset else 'weight'}",
        )
    )


def qk_norm_layers(st: AnalyzerState, rotary: list[bool], normed: list[bool], where: str) -> None:
    """q/k norms on some layers only: on exactly the layers that rotate
    (Llama 4's ``if use_qk_norm and use_rope``) they are
    ``attention.qk_norm_layers = "rope"``; on another subset, unknown."""
    if not st.result.qk_norm_modules or all(normed) or len(normed) != len(rotary):
        return
    on = [i for i, x in enumerate(normed) if x]
    if normed == rotary:
        st.add(
            known(
                "rope",
                "attention.qk_norm_layers",
                CODE,
                f"{where}: q/k norms on the RoPE layers {ranges(on)} only",
            )
        )
    else:
        st.add(unknown("attention.qk_norm", CODE, f"{where}: q/k norms on layers {ranges(on)} only"))


def value_norm(st: AnalyzerState, g: AttentionGraph) -> None:
    """A norm applied to the value projection's output alone (Gemma 3n,
    Gemma 4's ``v_norm``): q/k norms do not describe it."""
    v_name = st.result.module_names.get("self_attn.v_proj", "").rsplit(".", 1)[-1]
    values = [c for c in g.inputs if c.ref is not None and c.ref.name == v_name]
    others = [c for c in g.inputs if all(c is not v for v in values)]
    if not values or not others:  # no separate value projection
        return
    for n in g.nodes:
        if not (n.kind == "module" and n.ref is not None and st.role(n.ref) == "norm" and n.args):
            continue
        normed = n.args[0]
        if any(depends_on(normed, v) for v in values) and not any(depends_on(normed, o) for o in others):
            st.add(
                known(
                    True,
                    "code.value_norm",
                    CODE,
                    f"{g.where}: {n.ref.name} normalises the values before the attention",
                )
            )
            return


def unrotated(st: AnalyzerState, value: Any) -> Any:
    """What a rotated query or key was rotated from: the ``i``-th result
    of a RoPE function (``q, k = apply_rotary_pos_emb(q, k, cos, sin)``)
    is its ``i``-th argument rotated. Any other value is returned as it
    is. (Both results depend on both arguments through the call, so a
    norm after RoPE would otherwise read as a norm of q and of k.)"""
    if isinstance(value, Node) and value.kind == "item" and len(value.args) == 2:
        call, index = value.args
        if (
            isinstance(call, Node)
            and isinstance(index, int)
            and st.is_rotation(call)
            and index < len(call.args)
        ):
            return call.args[index]
    return value


_SAME_WIDTH = ("to", "float", "type_as", "contiguous", "clone")


def _applied_width(st: AnalyzerState, g: AttentionGraph, inst: Instance) -> int | None:
    """The width a norm without a learned weight (no size of its own)
    normalises: the last size of the view of a projection it reads, followed
    through the rotation and dtype casts only (Llama 4's L2 norm of
    ``q_proj(x).view(..., -1, head_dim)`` rotated); None when the norm's
    inputs do not all end in the same literal size."""
    if st.norm_info(inst)["affine"]:
        return None
    widths = set()
    for node in g.nodes:
        if node.kind == "module" and node.ref is inst and node.args:
            widths.add(_view_width(st, node.args[0]))
    return widths.pop() if len(widths) == 1 else None


def _view_width(st: AnalyzerState, value: Any) -> int | None:
    """The last size of the view a value is, through the rotation (the
    query or the key the rotation returns), dtype casts and transposes of
    other dimensions (NanoChat's ``q_proj(x).view(*x.shape[:-1], -1,
    head_dim).transpose(1, 2)`` rotated)."""
    transposed: set[int] = set()
    index = 0
    for _ in range(8):
        if not isinstance(value, Node) or not value.args:
            return None
        if value.kind == "item":
            index = value.args[1] if len(value.args) > 1 and isinstance(value.args[1], int) else 0
            value = value.args[0]
        elif value.kind == "method" and value.name in _SAME_WIDTH:
            value = value.args[0]
        elif value.kind == "func" and st.is_rotation(value):
            value = value.args[index] if index < len(value.args) else value.args[0]
            index = 0
        elif value.kind == "method" and value.name == "transpose" and len(value.args) == 3:
            dims = value.args[1:]
            if not all(isinstance(d, int) and not isinstance(d, bool) for d in dims):
                return None
            transposed.update(dims)
            value = value.args[0]
        elif value.kind == "method" and value.name in ("view", "reshape"):
            shape = value.args[1:] if len(value.args) > 2 else value.args[1:2]
            if len(shape) == 1 and isinstance(shape[0], tuple):
                shape = shape[0]
            rank = _view_rank(shape)
            if not shape or (transposed and (rank is None or transposed & {-1, rank - 1})):
                return None
            last = shape[-1]
            return last if isinstance(last, int) and not isinstance(last, bool) else None
        else:
            return None
    return None


def _view_rank(shape: Any) -> int | None:
    """The number of dimensions of ``view(*shape)``: its sizes, a starred
    ``x.shape[:-1]`` of a layer input counted as its two leading dimensions
    (a decoder's hidden states are batch x sequence x hidden); None for
    another starred size."""
    rank = 0
    for size in shape:
        if isinstance(size, Node) and size.kind == "starred":
            inner = size.args[0] if size.args else None
            if not (_leading_input_dims(inner)):
                return None
            rank += 2
        else:
            rank += 1
    return rank


def _leading_input_dims(value: Any) -> bool:
    """``x.shape[:-1]`` of an input of the forward."""
    if not (isinstance(value, Node) and value.kind == "item" and len(value.args) == 2):
        return False
    shape, cut = value.args
    return (
        cut == slice(None, -1, None)
        and isinstance(shape, Node)
        and shape.kind == "attr"
        and shape.name == "shape"
        and bool(shape.args)
        and isinstance(shape.args[0], Node)
        and shape.args[0].kind == "input"
    )


def _norm_width(st: AnalyzerState, inst: Instance) -> int | None:
    width = st.norm_info(inst)["width"]
    if width is None:
        width = first_int(inst.args)
    return width


def _child_norm_kind(st: AnalyzerState, inst: Instance) -> str | None:
    kinds = {st.norm_info(c)["kind"] for _, c in inst.children()}
    return kinds.pop() if len(kinds) == 1 else None
