"""What the backbone passes each decoder layer, and what each layer's
attention computes with it.

The backbone's ``forward`` is run once more with its loop over the layers
unrolled for every layer (the other sections read the first layer only),
so an argument it gives some layers and withholds from others is seen per
layer: position embeddings passed as ``None`` (those layers apply no RoPE,
GraniteSWA's ``layer_rope_theta`` of 0), or taken from different rotary
modules (a RoPE base per layer). Each layer's attention is then traced with
the arguments its layer really passes it: an argument of the layer that the
backbone gives as ``None`` and the layer hands on to the attention is bound
to ``None`` there, so the attention's own ``if position_embeddings is not
None`` takes the side the model takes on that layer."""

from __future__ import annotations

import ast
from typing import Any

from autoport_cst.research.analysis.state import AnalyzerState
from autoport_cst.research.interp.values import FuncRef, Instance, Node, SourceClass, merge_returns
from autoport_cst.research.interp.walk import children_of, walk


def layer_calls(st: AnalyzerState) -> dict[int, list[Node]]:
    """Per decoder layer index, its calls in the backbone's forward (one per
    path the interpreter followed); {} when the forward was not followed."""
    if st.layer_calls is None:
        st.layer_calls = _layer_calls(st)
    return st.layer_calls


def _layer_calls(st: AnalyzerState) -> dict[int, list[Node]]:
    backbone = st.backbone
    if backbone is None or not st.layers:
        return {}
    interp = st.interp
    interp.every_layer = True
    try:
        states = interp.run_method(backbone, "forward", [])
    except RecursionError:  # pragma: no cover - pathological source
        states = []
    finally:
        interp.every_layer = False
    index = {id(layer): i for i, layer in enumerate(st.layers)}
    calls: dict[int, list[Node]] = {}
    for state in states:
        if not state.returned:
            continue
        for node in walk(state.value):
            if node.kind == "module" and id(node.ref) in index:
                calls.setdefault(index[id(node.ref)], []).append(node)
    return calls


def layer_arguments(st: AnalyzerState, index: int, call: Node) -> dict[str, Any]:
    """The arguments of one call of layer ``index``, by the names of its
    ``forward``'s parameters."""
    names = forward_parameters(st, st.layers[index])
    bound = dict(zip(names, call.args, strict=False))
    bound.update(dict(call.kwargs))
    return bound


def withheld(st: AnalyzerState, index: int) -> frozenset[str]:
    """The parameters of layer ``index``'s forward that the backbone passes
    as ``None`` on every path it took."""
    calls = layer_calls(st).get(index, [])
    if not calls:
        return frozenset()
    sets = [
        {name for name, value in layer_arguments(st, index, call).items() if value is None} for call in calls
    ]
    return frozenset(set.intersection(*sets))


def attention_outputs(st: AnalyzerState, index: int) -> list[Any]:
    """The outputs of layer ``index``'s attention, traced with ``None`` for
    the arguments its layer passes on from what the backbone withholds."""
    attn = dict(st.layers[index].children()).get(st.attn_name)
    if attn is None:
        return []
    nones = _attention_nones(st, st.layers[index], attn, withheld(st, index))
    if not nones:
        return st.outputs(attn)
    try:
        states = st.interp.run_method(attn, "forward", [], dict.fromkeys(nones))
    except RecursionError:  # pragma: no cover - pathological source
        return []
    values = []
    for state in states:
        if state.returned:
            value = state.value
            values.append(value[0] if isinstance(value, (tuple, list)) and value else value)
    return values


def _attention_nones(st: AnalyzerState, layer: Instance, attn: Instance, nones: frozenset[str]) -> set[str]:
    """The parameters of the attention's forward that its layer fills with
    one of its own parameters named in ``nones``."""
    if not nones:
        return set()
    names = forward_parameters(st, attn)
    found: set[str] = set()
    for state in st.forward(layer):
        for node in walk(state.value):
            if node.kind != "module" or node.ref is not attn:
                continue
            pairs = [*zip(names, node.args, strict=False), *node.kwargs]
            found |= {
                name
                for name, value in pairs
                if isinstance(value, Node) and value.kind == "input" and value.name in nones
            }
    return found


CAUSAL_MASK = "transformers.masking_utils.create_causal_mask"
MASK_OVERLAYS = ("or_mask_function", "and_mask_function")


def plain_causal_mask(st: AnalyzerState, index: int, name: str) -> bool:
    """Whether the attention parameter ``name`` of layer ``index`` is, on
    every path, the mask transformers' ``create_causal_mask`` builds with no
    overlay (every earlier position, no window), handed on by the layer."""
    values = attention_argument(st, index, name)
    return bool(values) and all(
        isinstance(v, Node)
        and v.kind == "call"
        and v.name == CAUSAL_MASK
        and not any(key in MASK_OVERLAYS for key, _ in v.kwargs)
        for v in values
    )


def attention_argument(st: AnalyzerState, index: int, name: str) -> list[Any]:
    """What the backbone passes, on each path, for the attention parameter
    ``name`` of layer ``index`` when the layer hands on one of its own
    parameters there; empty when it passes something else."""
    layer = st.layers[index]
    attn = dict(layer.children()).get(st.attn_name)
    if attn is None:
        return []
    names = forward_parameters(st, attn)
    given: set[str] = set()
    for state in st.forward(layer):
        for node in walk(state.value):
            if node.kind == "module" and node.ref is attn:
                pairs = dict([*zip(names, node.args, strict=False), *node.kwargs])
                value = pairs.get(name)
                if not (isinstance(value, Node) and value.kind == "input"):
                    return []
                given.add(value.name)
    if len(given) != 1:
        return []
    (own,) = given
    return [layer_arguments(st, index, call).get(own) for call in layer_calls(st).get(index, [])]


def rotary_sources(st: AnalyzerState, index: int) -> list[Instance]:
    """The rotary-embedding modules whose output the backbone passes layer
    ``index`` (distinct, in the order met)."""
    found: list[Instance] = []
    layers = {id(layer) for layer in st.layers}
    for call in layer_calls(st).get(index, []):
        for node in _walk_before(call, layers):
            if node.kind == "module" and isinstance(node.ref, Instance) and st.role(node.ref) == "rotary":
                if not any(node.ref is f for f in found):
                    found.append(node.ref)
    return found


def _walk_before(call: Node, layers: set[int]) -> list[Node]:
    """The nodes a layer call's arguments are computed from, without going
    into the calls of other layers (the hidden states they produced)."""
    seen: set[int] = set()
    out: list[Node] = []
    stack: list[Any] = [*call.args, *(v for _, v in call.kwargs)]
    while stack:
        current = stack.pop()
        if isinstance(current, Node):
            if id(current) in seen or (current.kind == "module" and id(current.ref) in layers):
                continue
            seen.add(id(current))
            out.append(current)
            stack.extend(children_of(current))
        elif isinstance(current, (tuple, list, dict)):
            stack.extend(children_of(current))
    return out


def forward_parameters(st: AnalyzerState, instance: Instance) -> list[str]:
    """The parameter names of an instance's ``forward`` after ``self``."""
    if not isinstance(instance.cls, SourceClass):
        return []
    found = st.interp.find_method(instance.cls, "forward")
    if found is None:
        return []
    fn = found[1]
    args: ast.arguments = fn.args
    return [a.arg for a in [*args.posonlyargs, *args.args][1:]]


def added_argument(st: AnalyzerState, call: Node) -> tuple[str, Any] | None:
    """The argument of the sublayer ``call`` that the sublayer adds to its
    own output, as ``(parameter, value)``: on every forward path its main
    output is ``parameter + f(...)`` with ``f`` not reading the parameter
    (through a function of the source such as BLOOM's ``dropout_add``, run
    on the symbolic arguments); None otherwise. BLOOM's attention and MLP,
    MPT's MLP: the residual add of the block, written inside the sublayer."""
    sub = call.ref
    if not isinstance(sub, Instance):
        return None
    names = forward_parameters(st, sub)
    given = {**dict(zip(names, call.args, strict=False)), **dict(call.kwargs)}
    outputs = st.outputs(sub)
    added = {_added_input(st, value) for value in outputs}
    param = added.pop() if len(added) == 1 else None
    if param is None or param not in given or param not in names[1:]:
        return None
    return param, given[param]


def _added_input(st: AnalyzerState, value: Any) -> str | None:
    """The input ``name`` when ``value`` is ``<name> + other`` and ``other``
    does not read it (a source function returning that is run first)."""
    for _ in range(3):
        if isinstance(value, Node) and value.kind == "func" and isinstance(value.ref, FuncRef):
            ref = value.ref
            value = merge_returns(
                st.interp.call_function(ref.module, ref.node, list(value.args), dict(value.kwargs))
            )
            continue
        break
    if not (
        isinstance(value, Node) and value.kind == "binop" and value.name == "add" and len(value.args) == 2
    ):
        return None
    for mine, other in (value.args, value.args[::-1]):
        if isinstance(mine, Node) and mine.kind == "input":
            if not any(n.kind == "input" and n.name == mine.name for n in walk(other)):
                return mine.name
    return None
