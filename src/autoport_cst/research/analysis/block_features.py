"""Computations of a decoder block beyond the ones the other sections
describe, named when research finds them: the residual added inside the
attention or MLP module (BLOOM, MPT), a per-head bias on the attention
scores built in the backbone (ALiBi: BLOOM, MPT, Falcon-RW), a norm on
the token embeddings (BLOOM) and fixed sinusoidal positions added to them
(XGLM). Each is an ``unsupported.<name>`` finding
whose value is the spec sections it explains: the fields research could
not classify in those sections follow from it, and the refusal names the
computation instead of them."""

from __future__ import annotations

import ast
from typing import Any

from autoport_cst.research.analysis import alibi, mixers, sinusoidal
from autoport_cst.research.analysis.graph import call_given, computes_sin_cos, sin_cos_table, strip_casts
from autoport_cst.research.analysis.layer_inputs import forward_parameters, layer_arguments, layer_calls
from autoport_cst.research.analysis.state import AnalyzerState
from autoport_cst.research.findings import CODE, known
from autoport_cst.research.interp.values import Instance, Node, SourceClass
from autoport_cst.research.interp.walk import depends_on, walk

# the findings of a per-head bias on the scores, read or not, beside which
# the attention written out is not named again
ALIBI_NAMES = ("alibi_positions", "alibi_in_mask")


def sublayer_residual(st: AnalyzerState, layer: Instance) -> None:
    """The attention or MLP module given the residual with its input, and
    adding it to its output itself (no residual add in the layer)."""
    named: dict[str, list[str]] = {"sublayer_residual": [], "residual_after_norm": []}
    for value in st.outputs(layer)[:1]:
        for call in walk(value):
            if call.kind != "module" or st.role(call.ref) not in ("attention", "mlp", "moe"):
                continue
            param = _residual_parameter(st, call)
            if param is None:
                continue
            text = f"{st.where(call.ref)} adds its argument {param!r} to its output"
            norm = _normed_residual(st, call, param)
            if norm is not None:
                text += f", given the output of the norm before it ({norm}) as {param!r}"
            named["residual_after_norm" if norm is not None else "sublayer_residual"].append(text)
    for name, texts in named.items():
        if texts:
            where = f"{st.where(layer)}: " + "; ".join(sorted(set(texts)))
            st.add(known(("norm", "residual"), f"unsupported.{name}", CODE, where))


def _normed_residual(st: AnalyzerState, call: Node, param: str) -> str | None:
    """The name of the norm whose output the sublayer ``call`` is given both
    as its input and as the residual ``param`` it adds (BLOOM with
    ``apply_residual_connection_post_layernorm``), or None."""
    given = dict(zip(forward_parameters(st, call.ref), call.args, strict=False)) | dict(call.kwargs)
    first, residual = strip_casts(call.args[0]), strip_casts(given.get(param))
    if not (isinstance(first, Node) and first.kind == "module" and st.role(first.ref) == "norm"):
        return None
    return first.ref.name if residual is first else None


def _residual_parameter(st: AnalyzerState, call: Node) -> str | None:
    """The parameter of the sublayer's forward that receives a tensor its
    first argument is computed from, when its output depends on it."""
    if not call.args:
        return None
    first = call.args[0]
    names = forward_parameters(st, call.ref)
    for index, arg in enumerate(call.args[1:], start=1):
        if not isinstance(arg, Node) or index >= len(names) or not _computed_from(first, arg):
            continue
        outputs = st.outputs(call.ref)
        if outputs and all(
            any(n.kind == "input" and n.name == names[index] for n in walk(v)) for v in outputs
        ):
            return names[index]
    return None


def _computed_from(value: Any, source: Node) -> bool:
    return value is source or depends_on(value, source)


def score_bias(st: AnalyzerState) -> None:
    """A tensor the backbone builds from the number of heads and passes to
    the layers, which the attention adds to its scores before the softmax:
    a per-head position bias (ALiBi), read as ``attention.alibi_*`` by
    :func:`.alibi.read`, or refused (``unsupported.alibi_positions``) saying
    what was not read."""
    heads = st.dims.get("num_heads")
    calls = layer_calls(st).get(0, [])
    if not calls or not isinstance(heads, int) or st.backbone is None:
        return
    layer = st.layers[0]
    attn = dict(layer.children()).get(st.attn_name)
    if attn is None:
        return
    scores = _softmax_inputs(st, attn)
    carriers: dict[str, tuple[Any, Node]] = {}
    for name, value in layer_arguments(st, 0, calls[0]).items():
        builder = call_given(value, heads)
        if builder is not None and any(n.kind == "input" and n.name == name for s in scores for n in walk(s)):
            carriers[name] = (value, builder)
    if _bias_in_mask(st, attn, heads, carriers):
        return
    for name, (value, builder) in carriers.items():
        why = alibi.read(st, builder, value, scores, attn, name)
        if why is None:
            return
        st.add(
            known(
                ("attention",),
                "unsupported.alibi_positions",
                CODE,
                f"{builder.name} in {st.where(st.backbone)} builds a bias per head ({heads} heads) that "
                f"{st.where(attn)} adds to the attention scores ({name}); not read: {why}",
            )
        )
        return


def _bias_in_mask(
    st: AnalyzerState, attn: Instance, heads: int, carriers: dict[str, tuple[Any, Node]]
) -> bool:
    """One bias built per head and given to the attention as two arguments
    its scores add (Falcon-RW: ``alibi``, and ``attention_mask``, into which
    the backbone folds the same bias): named ``unsupported.alibi_in_mask``
    (the written-out scores add it twice, a kernel given the mask alone
    once), not read as ALiBi."""
    builders = {id(builder) for _, builder in carriers.values()}
    if len(carriers) < 2 or len(builders) != 1 or st.backbone is None:
        return False
    builder = next(iter(carriers.values()))[1]
    st.add(
        known(
            ("attention",),
            "unsupported.alibi_in_mask",
            CODE,
            f"{builder.name} in {st.where(st.backbone)} builds a bias per head ({heads} heads) that "
            f"{st.where(attn)} adds to its scores twice, as {' and as '.join(carriers)}, each computed from "
            "it; an attention given one of them alone adds it once",
        )
    )
    return True


def explicit_attention(st: AnalyzerState) -> None:
    """Attention written out (the scores as a product of queries and keys, a
    softmax) with no kernel call, whose scale, softcap, sinks and window
    research reads from a kernel's arguments (:func:`.mixers.explicit_scores`)."""
    attn = dict(st.layers[0].children()).get(st.attn_name)
    if attn is None or any(st.result.get(f"unsupported.{n}") is not None for n in ALIBI_NAMES):
        return
    mixers.explicit_scores(st, attn, ("attention",))


def _softmax_inputs(st: AnalyzerState, attn: Instance) -> list[Any]:
    return [
        n.args[0]
        for value in st.outputs(attn)
        for n in walk(value)
        if n.kind in ("call", "method") and n.name.rsplit(".", 1)[-1] == "softmax" and n.args
    ]


def rope_base_in_code(st: AnalyzerState) -> None:
    """Rotary frequencies computed from a base written in the code
    (GPT-J's ``10000 ** (arange(0, dim, 2) / dim)``) by a module of the
    backbone or the attention, for a config with no RoPE fields: the base
    (``rope.theta_in_code``), and the default frequencies (``rope.type``:
    the base raised to ``arange(0, dim, 2) / dim``, nothing scaled)."""
    config = st.interp.config
    if any(config.has(key) for key in ("rope_theta", "rope_parameters", "rope_scaling")):
        return
    owners = [child for _, child in st.backbone.children()] if st.backbone is not None else []
    owners += [c for n, c in st.layers[0].children() if n == st.attn_name]
    for owner in owners:
        if not isinstance(owner.cls, SourceClass):
            continue
        found = _constant_base(st, owner.cls)
        if found is not None:
            base, where = found
            evidence = (
                f"{where} computes the rotary frequencies from the base {base:g} written in the code "
                "(the config has no rope_theta)"
            )
            st.add(known(base, "rope.theta_in_code", CODE, evidence))
            st.add(known("default", "rope.type", CODE, evidence))
            return


def _constant_base(st: AnalyzerState, cls: SourceClass) -> tuple[float, str] | None:
    """A number raised to a power in ``cls.__init__`` or in a function of
    its module that ``__init__`` calls: the base and where."""
    found = st.interp.find_method(cls, "__init__")
    if found is None:
        return None
    init = found[1]
    functions = {f.name: f for f in cls.module.statements if isinstance(f, ast.FunctionDef)}
    called = [
        functions[n.func.id]
        for n in ast.walk(init)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in functions
    ]
    for fn, where in [
        (init, f"{cls.name}.__init__"),
        *((f, f"{f.name} ({cls.name}.__init__)") for f in called),
    ]:
        for node in ast.walk(fn):
            if (
                isinstance(node, ast.BinOp)
                and isinstance(node.op, ast.Pow)
                and isinstance(node.left, ast.Constant)
                and isinstance(node.left.value, (int, float))
                and not isinstance(node.left.value, bool)
                and node.left.value > 1
            ):
                return float(node.left.value), where
    return None


def sinusoidal_positions(st: AnalyzerState, backbone: Instance) -> None:
    """A module of the backbone, not an embedding, whose output enters the
    first layer's input and whose class computes sines and cosines: a table
    of fixed sinusoidal positions added to the token embedding. One module
    whose table :func:`.sinusoidal.read` reads (XGLM) is
    ``embedding.sinusoidal_positions`` with its base, offset and padding
    field; anything else (CTRL's function filling a buffer) is named."""
    children = {
        id(c): (n, c) for n, c in backbone.children() if st.role(c) not in ("embedding", "norm", "dropout")
    }
    found: dict[str, str] = {}
    modules: dict[str, Instance] = {}
    for state in st.forward(backbone):
        for call in walk(state.value):
            if call.kind != "module" or call.ref is not st.layers[0]:
                continue
            value = call.args[0] if call.args else call.kwarg("hidden_states")
            for node in walk(value):
                if node.kind == "module" and id(node.ref) in children and computes_sin_cos(node.ref):
                    name, module = children[id(node.ref)]
                    found[name], modules[name] = node.ref.class_name, module
            if (table := sin_cos_table(value)) is not None:  # a buffer a function of the source fills (CTRL)
                found[table.name] = f"a function, {table.module.line_of(table.node)}"
    if not found:
        return
    shown = ", ".join(f"{name} ({cls})" for name, cls in sorted(found.items()))
    where = f"{st.where(backbone)}: the first layer's input adds {shown}"
    read = sinusoidal.read(st, next(iter(modules.values()))) if len(found) == len(modules) == 1 else None
    if isinstance(read, sinusoidal.SinusoidalTable):
        st.add(known(True, "embedding.sinusoidal_positions", CODE, f"{where}: {read.evidence}"))
        st.add(known(read.base, "embedding.positions_base", CODE, read.evidence))
        st.add(known(read.offset, "embedding.positions_offset", CODE, read.evidence))
        st.add(known(read.padding_key, "embedding.positions_padding_key", CODE, read.evidence))
        return
    why = f"; not read: {read}" if read is not None else ""
    st.add(
        known(
            ("embedding",),
            "unsupported.sinusoidal_positions",
            CODE,
            f"{where}, a table of sines and cosines of the positions computed in the code, to the token "
            f"embedding{why}",
        )
    )


def embedding_norm_like_layers(st: AnalyzerState, backbone: Instance) -> None:
    """A norm of the backbone applied to the token embedding before the
    first layer that computes what the decoder layers' norms do (BLOOM's
    ``word_embeddings_layernorm``, NanoChat's shared ``norm``):
    ``embedding.norm``, its module path as ``model.embed_norm``. Run before
    the embedding's scale is read, which looks through it."""
    found = _first_normed(st)
    if found is None:
        return
    text, norm = found
    if norm is None or _unlike_layer_norms(st, norm) is not None:
        return
    if st.norm_info(norm)["affine"]:  # its tensors' checkpoint module (none without a weight: NanoChat)
        path = st.result.module_names.get("model")
        st.result.module_names["model.embed_norm"] = f"{path}.{norm.name}" if path else str(norm.name)
    st.add(known(True, "embedding.norm", CODE, f"{st.where(backbone)}: {text}, a norm like the layers'"))


def embedding_norm(st: AnalyzerState, backbone: Instance) -> None:
    """A norm applied to the token embedding before the first layer, in the
    backbone (BLOOM's ``word_embeddings_layernorm``) or in the embedding
    module's own forward (Inkling's ``InklingNormedEmbedding``), on one of
    the paths the backbone's forward takes, that no port computes: named
    with how it differs from the layers' norms."""
    found = _first_normed(st)
    known_norm = st.result.get("embedding.norm")
    if found is None or (known_norm is not None and known_norm.value is True):
        return
    text, norm = found
    differs = _unlike_layer_norms(st, norm) if norm is not None else "the embedding module's own"
    st.add(
        known(("embedding",), "unsupported.embedding_norm", CODE, f"{st.where(backbone)}: {text} ({differs})")
    )


def _first_normed(st: AnalyzerState) -> tuple[str, Instance | None] | None:
    """How the first layer's input normalizes the token embeddings, and the
    backbone's norm that does it (None: the embedding module's own)."""
    for call in layer_calls(st).get(0, []):
        text = _normed_embedding(st, strip_casts(call.args[0])) if call.args else None
        if text is not None:
            return text, _backbone_norm(st, strip_casts(call.args[0]))
    return None


# what a norm computes, as AnalyzerState.norm_info reads it
NORM_FACTS = ("kind", "bias", "unit_offset", "affine", "eps", "eps_key")
# the decoder-layer norms, by their canonical names, the first a layer has compared
LAYER_NORMS = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm")


def _backbone_norm(st: AnalyzerState, value: Any) -> Instance | None:
    """The backbone's norm module whose output ``value`` is (through dropouts)."""
    for _ in range(4):
        if not (isinstance(value, Node) and value.kind == "module" and value.args):
            return None
        if st.role(value.ref) == "norm":
            return value.ref
        value = strip_casts(value.args[0])
    return None


def _unlike_layer_norms(st: AnalyzerState, norm: Instance) -> str | None:
    """How the embedding norm differs from the decoder layers' norms (its
    kind, bias, weight form, affinity, epsilon), or None when it computes
    what they do."""
    children = dict(st.layers[0].children())
    names = st.result.module_names
    layer_norm = next((children[n] for key in LAYER_NORMS if (n := names.get(key)) in children), None)
    if layer_norm is None:
        return "no decoder-layer norm to compare it with"
    mine, theirs = st.norm_info(norm), st.norm_info(layer_norm)
    if mine["kind"] is None:
        return "its computation is not classified"
    differs = [
        f"{k} {mine[k]!r} where the layers' is {theirs[k]!r}" for k in NORM_FACTS if mine[k] != theirs[k]
    ]
    return "; ".join(differs) or None


def _normed_embedding(st: AnalyzerState, value: Any) -> str | None:
    """How ``value``, the first layer's input, normalizes the token
    embeddings (through dropouts at most), or None."""
    for _ in range(4):
        if not (isinstance(value, Node) and value.kind == "module" and value.args):
            return None
        role = st.role(value.ref)
        if role == "embedding":
            return _own_norm(st, value.ref)
        if role == "norm":
            break
        if role != "dropout":
            return None
        value = strip_casts(value.args[0])
    else:
        return None
    if any(n.kind == "module" and st.role(n.ref) == "embedding" for n in walk(value.args[0])):
        return f"{value.ref.name} ({value.ref.class_name}) normalizes the token embeddings before the first layer"
    return None


def _own_norm(st: AnalyzerState, embed: Instance) -> str | None:
    """The norm an embedding module applies to its own output, as a clause."""
    for value in st.outputs(embed)[:1]:
        top = strip_casts(value)
        if isinstance(top, Node) and top.kind == "module" and st.role(top.ref) == "norm":
            return (
                f"{embed.name} ({embed.class_name}) normalizes its own output with {top.ref.name} "
                f"({top.ref.class_name}) before the first layer"
            )
    return None


def embedding_projection(st: AnalyzerState, backbone: Instance) -> None:
    """Linear layers of the backbone between the token embedding and the
    first layer (and from the last layer to the head): token embeddings of
    another width than the layers', projected in and out (OPT's
    ``project_in`` / ``project_out`` when ``word_embed_proj_dim`` differs
    from the hidden size)."""
    linears = {id(c): c for _, c in backbone.children() if st.role(c) == "linear"}
    layers = {id(layer) for layer in st.layers}
    found: dict[str, str] = {}
    for state in st.forward(backbone):
        for node in walk(state.value):
            if node.kind != "module" or id(node.ref) not in linears or not node.args:
                continue
            read = {
                st.role(m.ref) if id(m.ref) not in layers else "layer"
                for m in walk(node.args[0])
                if m.kind == "module"
            }
            sizes = f"{node.ref.args.get('in_features')} -> {node.ref.args.get('out_features')}"
            if "layer" in read:
                found[node.ref.name or "?"] = f"{node.ref.name} ({sizes}) projects the last layer's output"
            elif "embedding" in read:
                found[node.ref.name or "?"] = f"{node.ref.name} ({sizes}) projects the token embeddings"
    if found:
        st.add(
            known(
                ("embedding",),
                "unsupported.embedding_projection",
                CODE,
                f"{st.where(backbone)}: " + "; ".join(found[name] for name in sorted(found)),
            )
        )
