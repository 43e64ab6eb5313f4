"""The RoPE section: which layers apply no rotation, the rotation function's
style (halves or interleaved pairs, read from its slicing), the rotary
dimension (``torch.arange(0, dim, 2)`` in the rotary module's inverse
frequencies, over head_dim), and no rotary embedding at all."""

from __future__ import annotations

import ast
from typing import Any

from autoport_cst.research.analysis import layer_inputs, nope_rule, rope_variants
from autoport_cst.research.analysis.graph import ranges, rotation_style
from autoport_cst.research.analysis.state import AnalyzerState, AttentionGraph
from autoport_cst.research.findings import CODE, known, unknown
from autoport_cst.research.interp.core import CallOptions
from autoport_cst.research.interp.values import (
    MODULE_LIST,
    UNKNOWN,
    FuncRef,
    Instance,
    SourceClass,
    is_concrete,
)
from autoport_cst.research.interp.walk import depends_on, walk
from autoport_cst.research.rotation_values import halves_turn, reads_usual_turn

# the config fields a port reads its layers without RoPE from (the nope-layers codemod)
NOPE_FIELDS = frozenset({"no_rope_layers", "no_rope_layer_interval"})


def analyze(st: AnalyzerState, g: AttentionGraph) -> None:
    """RoPE as the first layer's attention ``g`` applies it, and per layer."""
    _nope_layers(st, g.where)
    _layer_bases(st, g.where)
    _style(st, _rotating_graph(st, g))


def _rotating_graph(st: AnalyzerState, g: AttentionGraph) -> AttentionGraph:
    """The graph the rotation's style is read from: the first layer's
    attention ``g``, or, when that layer applies no rotation and a later one
    does (Flint: no RoPE on its full-attention layer 0), the first rotating
    layer's."""
    rotary = st.layer_rotation
    if len(rotary) != len(st.layers) or rotary[0] or not any(rotary):
        return g
    index = rotary.index(True)
    attn = dict(st.layers[index].children()).get(st.attn_name)
    outs = layer_inputs.attention_outputs(st, index)
    if attn is None or not outs:
        return g
    nodes = list(walk(outs[0]))
    linear = [n for n in nodes if n.kind == "module" and n.ref is not None and st.role(n.ref) == "linear"]
    inputs = [
        call
        for call in linear
        if not any(depends_on(call.args[0] if call.args else None, o) for o in linear if o is not call)
    ]
    return AttentionGraph(attn, st.where(attn), nodes, inputs, [], [], [])


def _nope_layers(st: AnalyzerState, where: str) -> None:
    """Layers whose attention applies no rotation (``st.layer_rotation``,
    recorded by the attention section for every traced layer)."""
    rotary = st.layer_rotation
    if rotary and not all(rotary) and any(rotary):
        nope = tuple(i for i, r in enumerate(rotary) if not r)
        st.add(
            known(
                nope, "rope.nope_layers", CODE, f"{where}: no rotation applied on layers {ranges(list(nope))}"
            )
        )
        unread = _nope_choice(st, rotary)
        if unread is not None:
            st.add(known(True, "unsupported.nope_layers", CODE, f"{where}: {unread}"))
    elif rotary and all(rotary):
        st.add(known(None, "rope.nope_layers", CODE, f"{where}: rotation applied on every layer"))
    elif rotary:
        st.no_rotation = True
        st.add(known(None, "rope.nope_layers", CODE, f"{where}: no layer applies a rotation"))


def _nope_choice(st: AnalyzerState, rotary: list[bool]) -> str | None:
    """Why the layers without RoPE are not the ones a port reads from
    ``NOPE_FIELDS`` (None: an attribute of the attention read from those
    fields tells them apart): the backbone withholds the position
    embeddings from them, or the attention's flag comes from other config
    fields (Cohere 2's sliding window: NoPE on full-attention layers)."""
    mixers = st.result.get("attention.other_mixer_layers")
    others = set(mixers.value or ()) if mixers is not None and mixers.known else set()
    nope = [i for i, r in enumerate(rotary) if not r and i not in others]
    if not nope:  # only layers without softmax attention (refused as such)
        return None
    backbone = [i for i in nope if layer_inputs.withheld(st, i)]
    if backbone:
        owner = st.backbone.class_name if st.backbone is not None else "the backbone"
        return (
            f"{owner}.forward passes no position embeddings to layers {ranges(backbone)} "
            f"({', '.join(sorted(layer_inputs.withheld(st, backbone[0])))} is None there); "
            f"a port reads its layers without RoPE from {' / '.join(sorted(NOPE_FIELDS))}"
        )
    kept = [i for i in range(len(rotary)) if i not in others]
    attns = [dict(st.layers[i].children()).get(st.attn_name) for i in kept]
    if any(a is None for a in attns):
        return "the attention of some layer was not found"
    keys: set[str] = set()
    for reads in _aligned_attributes(attns, [rotary[i] for i in kept]).values():
        if reads <= NOPE_FIELDS:
            return None
        keys |= reads
    kinds = _nope_layer_types(st, rotary, kept)
    rule, why = nope_rule.recognize(st, rotary, kept) if kinds is not None else (None, "")
    if rule is not None:
        st.add(known(rule, "rope.nope_rule", CODE, why))
        return None
    if kinds is not None:
        keys.add("layer_types")
    told = f"config.{', config.'.join(sorted(keys))}" if keys else "no config field the analysis saw"
    if kinds is not None:
        told += f" (no RoPE on its {' and '.join(kinds)} layers: {why})"
    return (
        f"the layers without RoPE are told apart by {told}; a port reads them from "
        f"{' / '.join(sorted(NOPE_FIELDS))} or from the sliding window's layer types"
    )


def _nope_layer_types(st: AnalyzerState, rotary: list[bool], kept: list[int]) -> list[str] | None:
    """The layer types of ``config.layer_types`` whose layers (of ``kept``)
    take no RoPE, when the layer type alone tells rotating and non-rotating
    layers apart (Cohere 2, Flint, EXAONE MoE: no RoPE on full attention);
    None otherwise. The attention may compute that from ``layer_types``
    through locals the interpreter does not attribute to a config field."""
    kinds = st.interp.config.read("layer_types", None)
    if not isinstance(kinds, (list, tuple)) or len(kinds) < len(rotary):
        return None
    rotates: dict[str, set[bool]] = {}
    for index in kept:
        rotates.setdefault(str(kinds[index]), set()).add(rotary[index])
    if len(rotates) < 2 or any(len(found) != 1 for found in rotates.values()):
        return None
    return sorted(kind for kind, found in rotates.items() if found == {False})


def _aligned_attributes(attns: list, rotary: list[bool]) -> dict[str, frozenset[str]]:
    """Attention attributes read from the config whose value decides, layer
    by layer, whether it rotates (equal values, equal rotation), with the
    config fields each was computed from."""
    found: dict[str, frozenset[str]] = {}
    for attr in attns[0].attrs:
        reads = attns[0].attr_reads.get(attr, frozenset())
        values = [a.attrs.get(attr, UNKNOWN) for a in attns]
        if not reads or not all(is_concrete(v) for v in values):
            continue
        by_value: dict[str, set[bool]] = {}
        for value, rotates in zip(values, rotary, strict=False):
            by_value.setdefault(repr(value), set()).add(rotates)
        if len(by_value) > 1 and all(len(r) == 1 for r in by_value.values()):
            found[attr] = frozenset(reads)
    return found


def _layer_bases(st: AnalyzerState, where: str) -> None:
    """Layers rotated by different rotary modules built from differently
    modified copies of the config (a RoPE base per layer): no spec field
    holds that."""
    sources: dict[int, Instance] = {}
    for index in range(len(st.layers)):
        found = layer_inputs.rotary_sources(st, index)
        if len(found) == 1:
            sources[index] = found[0]
    distinct: dict[str, list[int]] = {_rotary_setting(m): [] for m in sources.values()}
    for index, module in sources.items():
        distinct[_rotary_setting(module)].append(index)
    if len(distinct) > 1:
        groups = "; ".join(f"layers {ranges(layers)}: {setting}" for setting, layers in distinct.items())
        st.add(
            known(
                True,
                "unsupported.layer_rope_bases",
                CODE,
                f"{where}: layers are rotated by different rotary modules ({groups})",
            )
        )
    elif sources:
        _base_field(st, where, sources)


def _base_field(st: AnalyzerState, where: str, sources: dict[int, Instance]) -> None:
    """One rotary module for every rotating layer, built from a copy of the
    config whose RoPE base the code set (GraniteSWA: ``rope_theta`` from
    ``layer_rope_theta[i]``): the config list holding that base per layer
    (0 or None on the layers without one) is what the model rotates with,
    not ``rope_theta``. Recorded as ``code.rope_base_field``."""
    theta = _override_theta(next(iter(sources.values())))
    if theta is None:
        return
    config = st.interp.config._config
    values = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    fields = [
        name
        for name, value in values.items()
        if isinstance(value, list)
        and len(value) == len(st.layers)
        and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)
        and all((v == theta) if i in sources else not v for i, v in enumerate(value))
    ]
    if len(fields) == 1:
        st.add(
            known(
                fields[0],
                "code.rope_base_field",
                CODE,
                f"{where}: every rotating layer's rotary module is built with rope_theta = {theta!r}, "
                f"the layer's entry of config.{fields[0]}",
            )
        )


def _override_theta(module: Instance) -> float | None:
    """The RoPE base the code set on the config copy ``module`` was built
    from, or None."""
    config = module.attrs.get("config", module.args.get("config"))
    overrides = getattr(config, "overrides", None) or {}
    rope = overrides.get("rope_parameters")
    theta = rope.get("rope_theta") if isinstance(rope, dict) else overrides.get("rope_theta")
    return theta if isinstance(theta, (int, float)) and not isinstance(theta, bool) else None


def _rotary_setting(module: Instance) -> str:
    """What tells rotary modules of one class apart: the config copy they
    were built from (the attributes the code set on it)."""
    config = module.attrs.get("config", module.args.get("config"))
    overrides = getattr(config, "overrides", None)
    if not overrides:
        return f"{module.class_name} on the model config"
    return f"{module.class_name} with " + ", ".join(f"{k}={v!r}" for k, v in sorted(overrides.items()))


def _layer_bound_styles(st: AnalyzerState) -> dict[str, str]:
    """The rotation functions on the path the first layer's attention takes
    with what its layer passes it (Falcon rotates only when the backbone
    passes no ALiBi tensor), by name, with their style."""
    styles = {}
    for value in layer_inputs.attention_outputs(st, 0)[:1]:
        nodes = list(walk(value))
        projections = [n for n in nodes if n.kind == "module" and st.role(n.ref) == "linear"]
        for n in nodes:
            if (
                n.kind == "func"
                and isinstance(n.ref, FuncRef)
                and any(depends_on(arg, c) for arg in n.args for c in projections)
                and (style := rotation_style(n.ref, st.interp)) is not None
            ):
                styles[n.ref.name] = style
    return styles


def _style(st: AnalyzerState, g: AttentionGraph) -> None:
    """The rotation function applied to the projections: its style."""
    nodes, inputs, where = g.nodes, g.inputs, g.where
    funcs = [
        n
        for n in nodes
        if n.kind == "func"
        and isinstance(n.ref, FuncRef)
        and any(depends_on(arg, c) for arg in n.args for c in inputs)
    ]
    styles = {}
    for n in funcs:
        style = rotation_style(n.ref, st.interp)
        if (
            style == "rotate_half"
            and not reads_usual_turn(n.ref.module.tree, n.ref.node)
            and halves_turn(n.ref.module.dotted, n.ref.name) == "rotate_half_swapped"
        ):
            style = "rotate_half_swapped"  # the halves turned the other way (NanoChat's rotate_half)
        if style is not None:
            styles[n.ref.name] = style
    styles = styles or _layer_bound_styles(st)
    if not styles:
        rotary = _find_rotary(st)
        if rotary is None or st.no_rotation:
            st.add(
                known(
                    "none", "rope.type", CODE, f"{where}: no rotary embedding module and no rotation applied"
                )
            )
        else:
            st.add(unknown("rope.style", CODE, f"{where}: rotation function not recognised"))
        return
    values = set(styles.values())
    names = ", ".join(f"{k} ({v})" for k, v in styles.items())
    rewritten = _frequency_writes(st)
    if rewritten:
        st.add(
            unknown(
                "rope.style",
                CODE,
                f"{where}: {names}, but {rewritten} writes into its cos/sin tables in place: which "
                "frequency each rotated pair takes is not read",
            )
        )
    elif len(values) == 1:
        st.add(known(values.pop(), "rope.style", CODE, f"{where}: {names}"))
    else:
        st.add(unknown("rope.style", CODE, f"{where}: {names}"))
    _rotary_dim(st, where)
    rope_variants.analyze(st, where)


def _frequency_writes(st: AnalyzerState) -> str | None:
    """A method of the rotary module that assigns into a slice of a tensor
    (Cohere Compass' M-RoPE sections recomposed from other axes): the
    interpreter does not follow in-place writes, so the frequencies it saw
    are not the ones used. The method, or None."""
    rotary = _find_rotary(st)
    if rotary is None or not isinstance(rotary.cls, SourceClass):
        return None
    for cls in st.interp.mro(rotary.cls):
        if not isinstance(cls, SourceClass):
            continue
        for fn in cls.node.body:
            if not isinstance(fn, ast.FunctionDef) or fn.name == "__init__":  # (its dict entries)
                continue
            for node in ast.walk(fn):
                targets = node.targets if isinstance(node, ast.Assign) else []
                if isinstance(node, ast.AugAssign):
                    targets = [node.target]
                if any(isinstance(t, ast.Subscript) for t in targets):
                    return f"{cls.name}.{fn.name}"
    return None


def _find_rotary(st: AnalyzerState) -> Instance | None:
    """The first rotary-embedding module under the causal LM (breadth first)."""
    stack = [st.top]
    seen = 0
    while stack and seen < 256:
        inst = stack.pop(0)
        seen += 1
        for _, child in inst.children():
            if st.role(child) == "rotary":
                return child
            if not child.is_external and child.cls != MODULE_LIST and "." not in (child.name or ""):
                stack.append(child)
    return None


def _layer_type_arguments(st: AnalyzerState, fn: ast.FunctionDef) -> list[dict[str, Any]]:
    """The keyword arguments a rotary method is called with: none, or, for
    one that takes the layer type (its RoPE parameters per layer type:
    Laguna, Mellum), each type of the config's layers."""
    names = [a.arg for a in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs]
    kinds = st.interp.config.read("layer_types", None)
    if "layer_type" not in names or not isinstance(kinds, (list, tuple)) or not kinds:
        return [{}]
    return [{"layer_type": kind} for kind in sorted(set(map(str, kinds)))]


def _arange_dims(interp: Any, klass: SourceClass, fn: ast.FunctionDef, args: list, kwargs: dict) -> list[int]:
    """The ``torch.arange(0, dim, 2)`` dimensions a rotary method computes."""
    try:
        states = interp.call_function(klass.module, fn, args, kwargs, CallOptions(owner=klass))
    except RecursionError:  # pragma: no cover
        states = []
    dims = []
    for state in states:
        for value in [state.value, *state.env.values()]:
            for n in walk(value):
                if (
                    n.kind == "call"
                    and n.name.endswith("arange")
                    and len(n.args) >= 3
                    and n.args[0] == 0
                    and n.args[2] == 2
                    and isinstance(n.args[1], int)
                ):
                    dims.append(n.args[1])
    return dims


def _rotary_dim(st: AnalyzerState, where: str) -> None:
    """The partial rotary factor: the inverse frequencies' dimension over head_dim."""
    rotary = _find_rotary(st)
    hd = st.dims.get("head_dim")
    if rotary is None or not isinstance(rotary.cls, SourceClass):
        st.add(unknown("rope.partial_rotary_factor", CODE, f"{where}: rotary embedding module not found"))
        return
    interp = st.interp
    dims = []
    for name in ("compute_default_rope_parameters", "__init__"):
        found = interp.find_method(rotary.cls, name)
        if found is None:
            continue
        klass, fn = found
        args = [interp.config] if name != "__init__" else [Instance(rotary.cls), interp.config]
        per_type = _layer_type_arguments(st, fn)
        for kwargs in per_type:
            dims += _arange_dims(interp, klass, fn, args, kwargs)
        if dims:
            evidence = f"{klass.name}.{name}: inv_freq over {dims[0]} of head_dim {hd}"
            break
    if dims and per_type != [{}] and any(d != hd for d in dims):
        # the factor sits in each layer type's RoPE parameters, where no port reads it
        types = ", ".join(str(kwargs["layer_type"]) for kwargs in per_type)
        st.add(
            unknown(
                "rope.partial_rotary_factor",
                CODE,
                f"{evidence}, from the RoPE parameters of each layer type ({types}): a port reads one factor",
            )
        )
        return
    if not dims or not isinstance(hd, int):
        st.add(
            unknown(
                "rope.partial_rotary_factor",
                CODE,
                f"{where}: rotary dimension not computable from {rotary.class_name}",
            )
        )
        return
    if len(set(dims)) != 1:
        st.add(unknown("rope.partial_rotary_factor", CODE, f"{where}: rotary dims {sorted(set(dims))}"))
        return
    if dims[0] > hd:  # the rotated part is another width than the heads' (latent attention's rope dims)
        st.add(unknown("rope.partial_rotary_factor", CODE, f"{evidence}: wider than the heads"))
        return
    st.add(known(dims[0] / hd, "rope.partial_rotary_factor", CODE, evidence))
