"""Hyper-connections, named from the decoder layer's code: the residual is
several streams mixed by learned weights rather than one stream a sublayer's
output is added to (DeepSeek-V4's ``DeepseekV4HyperConnection``: a module of
the layer computes, from the streams, the weights that collapse them into the
sublayer's input, and those that mix the streams among themselves
(``torch.matmul(comb, hidden_states)``) and with the sublayer's output).

Named as ``unsupported.hyper_connections`` where the layer's output
multiplies its own input by a matrix a module of the layer computes, and a
sublayer reads a value that module computes: no reference carries more than
one residual stream. The norm placement and the residual structure, read
from one stream added to, then follow from it; so does the first layer's
input when the backbone copies the token embeddings into the streams."""

from __future__ import annotations

from autoport_cst.research.analysis.layer_inputs import forward_parameters
from autoport_cst.research.analysis.state import AnalyzerState
from autoport_cst.research.findings import CODE, known
from autoport_cst.research.interp.values import Instance, Node
from autoport_cst.research.interp.walk import depends_on, walk

# what a layer's sublayers are; a module mixing the streams is none of these
SUBLAYERS = ("attention", "mlp", "moe", "other")
MATMULS = ("matmul", "bmm", "einsum")
# tensor methods that copy a value into several streams
COPIES = ("expand", "repeat", "expand_as", "repeat_interleave")


def hyper_connections(st: AnalyzerState, layer: Instance, backbone: Instance | None = None) -> bool:
    """Name the layer's hyper-connections (the modules computing the mixing
    weights, and what they mix); True when named."""
    children = {id(c): (n, c) for n, c in layer.children() if "." not in n}
    params = forward_parameters(st, layer)
    if not params:
        return False
    mixers: dict[str, Instance] = {}
    for value in st.outputs(layer)[:1]:
        nodes = list(walk(value))
        sublayer_calls = [
            n for n in nodes if n.kind == "module" and id(n.ref) in children and st.role(n.ref) in SUBLAYERS
        ]
        for node in nodes:
            if not _is_matmul(node) or len(node.args) < 2:
                continue
            for index, weights in enumerate(node.args[:2]):
                streams = node.args[1 - index]
                if not _reads_input(streams, params[0]):
                    continue
                for call in _mixer_calls(st, weights, children):
                    if any(_reads_call(s, call) for s in sublayer_calls):
                        mixers[children[id(call.ref)][0]] = call.ref
    if not mixers:
        return False
    order = [n for n, _ in layer.children()]
    shown = ", ".join(
        f"{n} ({mixers[n].class_name}, {st.where(mixers[n])})" for n in sorted(mixers, key=order.index)
    )
    copied = _copied_embeddings(st, backbone, layer) if backbone is not None else ""
    explains = ("norm", "residual", "embedding") if copied else ("norm", "residual")
    st.add(
        known(
            explains,
            "unsupported.hyper_connections",
            CODE,
            f"{st.where(layer)}: the residual is several streams mixed by learned weights: {shown} compute "
            "from the streams the weights that collapse them into the sublayer's input and mix them "
            f"(matmul) with its output{copied}",
        )
    )
    return True


def _is_matmul(node: Node) -> bool:
    name = node.name.rsplit(".", 1)[-1]
    return (node.kind in ("call", "method") and name in MATMULS) or (
        node.kind == "binop" and name == "matmul"
    )


def _reads_input(value: object, name: str) -> bool:
    return any(n.kind == "input" and n.name == name for n in walk(value))


def _mixer_calls(st: AnalyzerState, weights: object, children: dict[int, tuple[str, Instance]]) -> list[Node]:
    """Calls of a child of the layer that is no sublayer (nor a plain linear
    layer) from which ``weights`` are computed."""
    return [
        n
        for n in _nearest_modules(weights)
        if id(n.ref) in children and st.role(n.ref) not in (*SUBLAYERS, "linear", "embedding")
    ]


def _nearest_modules(value: object) -> list[Node]:
    """The module calls ``value`` is computed from with no other module call
    in between (not those feeding the modules' own inputs)."""
    found: list[Node] = []
    seen: set[int] = set()
    stack = [value]
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, Node) and current.kind == "module":
            found.append(current)
        elif isinstance(current, Node):
            stack.extend([*current.args, *(v for _, v in current.kwargs)])
        elif isinstance(current, (tuple, list)):
            stack.extend(current)
    return found


def _reads_call(sublayer: Node, call: Node) -> bool:
    """The sublayer call's arguments are computed from ``call``."""
    arguments = [*sublayer.args, *(v for _, v in sublayer.kwargs)]
    return any(a is call or depends_on(a, call) for a in arguments)


def _copied_embeddings(st: AnalyzerState, backbone: Instance, layer: Instance) -> str:
    """How the backbone gives the first layer its streams: the token
    embeddings copied (``expand``, ``repeat``), as a clause; empty when not."""
    embeddings = {id(c) for _, c in backbone.children() if st.role(c) == "embedding"}
    for state in st.forward(backbone):
        for call in walk(state.value):
            if call.kind != "module" or call.ref is not layer:
                continue
            first = call.args[0] if call.args else call.kwarg("hidden_states")
            for node in walk(first):
                name = node.name.rsplit(".", 1)[-1]
                if node.kind == "method" and name in COPIES and _from_embeddings(node, embeddings):
                    return f"; {backbone.class_name} copies the token embeddings into the streams ({name})"
    return ""


def _from_embeddings(node: Node, embeddings: set[int]) -> bool:
    return any(n.kind == "module" and id(n.ref) in embeddings for n in walk(node)) or any(
        n.kind == "input" and n.name == "inputs_embeds" for n in walk(node)
    )
