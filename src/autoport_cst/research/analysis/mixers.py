"""What a block computes when research cannot read it as one softmax
attention and one feed-forward, named from its code: a token mixer that
carries a state from position to position (a loop over the positions:
state-space scans, linear attention, RNN cells: Mamba, RWKV, xLSTM, the
linear-attention layers of hybrids), one that mixes positions by a causal
convolution alone (LFM's short convolution), routed experts chosen without a
top-k of the router scores (PhiMoE's sparsemixer), several attention
sublayers in one layer, and, for an attention one module down, what its
wrapper and the attention inside compute (the residual added and normed in
the wrapper: BERT's ``BertSelfOutput``, DBRX's ``DbrxNormAttentionNorm``;
scores and softmax written out: GPT-Neo; clamped projections: DBRX's
``clip_qkv``).

Each is an ``unsupported.<name>`` finding whose value names the analysis
failure it explains (``code.decoder_layers``, ``code.attention``): the
refusal then names the computation, not layers or an attention not found
(research/decide/unsupported.py). What matches none of these is left to the
failure's own text."""

from __future__ import annotations

import ast
from collections.abc import Iterator

from autoport_cst.research.analysis import scores
from autoport_cst.research.analysis.graph import ranges
from autoport_cst.research.analysis.layer_inputs import forward_parameters
from autoport_cst.research.analysis.state import AnalyzerState, softmax_modules
from autoport_cst.research.findings import CODE, known
from autoport_cst.research.interp.values import MODULE_LIST, Instance, Node, SourceClass
from autoport_cst.research.interp.walk import depends_on, walk

# roles whose computation another section reads
READ_ROLES = ("attention", "norm", "linear", "dropout", "embedding", "mlp", "moe", "rotary", "activation")
CLAMPS = ("clamp", "clamp_", "clip", "clip_")


def name_block(st: AnalyzerState, block: Instance, explains: tuple[str, ...], routing: bool = True) -> bool:
    """Name what the children of ``block`` that no section reads compute
    (routing without top-k unless not ``routing``, a recurrent or
    convolutional token mixer); True when one is named. In a block without
    attention holding several feed-forwards, those are looked at too (one of
    them mixes the positions: RecurrentGemma's temporal block)."""
    children = [(n, c) for n, c in block.children() if "." not in n]
    roles = [st.role(c) for _, c in children]
    attentions = [n for (n, _), r in zip(children, roles, strict=True) if r == "attention"]
    if len(attentions) > 1 and "code.decoder_layers" in explains:
        several_attentions(st, block, attentions, explains)  # TrOCR's self_attn and encoder_attn
        return True
    several = "attention" not in roles and sum(r in ("mlp", "moe") for r in roles) > 1
    named = False
    for (name, child), role in zip(children, roles, strict=True):
        if role in READ_ROLES and not (several and role == "mlp"):
            continue
        if attentions and not _called_with_attention(st, block, child):
            # built beside it only where the config leaves the layer's kind unknown (LFM2-MoE):
            # named when forward runs it on another path, in place of the attention
            if _called_instead_of_attention(st, block, child):
                named = _token_mixer(st, block, name, child, explains, instead=True) or named
            continue
        if routing and role not in READ_ROLES and _routing_without_topk(st, name, child, explains):
            named = True
        elif _token_mixer(st, block, name, child, explains):
            named = True
    return named


def routing_beside_attention(st: AnalyzerState, layer: Instance) -> None:
    """The feed-forward of a layer with an attention, when it routes to
    experts without a top-k of the router scores (DeepSeek-V4's hash
    layers), named as explaining the MLP and MoE sections."""
    for name, child in layer.children():
        if "." not in name and st.role(child) in ("mlp", "other"):
            if _routing_without_topk(st, name, child, ("mlp", "moe")):
                return


def routed_attention(st: AnalyzerState, attn: Instance) -> None:
    """An attention holding a routed module (a top-k of router scores
    inside): projections chosen per token among experts (JetMoE's mixture
    of attention heads, ``JetMoeMoA``), named with the module."""
    routed = [(n, c) for n, c in attn.children() if "." not in n and st.role(c) == "moe"]
    if routed:
        name, child = routed[0]
        banks = [
            f"{n} ({c.class_name}: {', '.join(f'{k} {list(p.shape)}' for k, p in c.params() if p.shape)})"
            for n, c in child.children()
            if "." not in n and st.role(c) == "experts"
        ]
        held = f"; the experts' weights: {', '.join(banks)}" if banks else ""
        st.add(
            known(
                ("attention",),
                "unsupported.routed_attention",
                CODE,
                f"{st.where(attn)}: {name} ({child.class_name}, {st.where(child)}) routes each token to "
                f"top-k experts for the attention's projections{held}",
            )
        )


def cross_attention_layers(st: AnalyzerState) -> None:
    """Layers whose attention projects its forward arguments, and whose
    forward gives some of them another value than the input of the others
    (Mllama's cross-attention layers: keys and values of the image states,
    ``cross_attention_states``; CTRL gives its ``v``, ``k`` and ``q`` one
    value), named with the layers of each such class."""
    seen: dict[str, list[int]] = {}
    named: dict[str, str] = {}
    for index, layer in enumerate(st.layers):
        seen.setdefault(layer.class_name, []).append(index)
        if len(seen[layer.class_name]) > 1:
            continue
        for name, attn in layer.children():
            if "." not in name and st.role(attn) == "attention" and (other := _other_input(st, layer, attn)):
                named[layer.class_name] = (
                    f"{name} ({st.where(attn)}) projects {other[0]} and {other[1]}, inputs the layer gives "
                    "different values"
                )
    if named:
        shown = "; ".join(
            f"{cls} (layers {ranges(seen[cls])} of {len(st.layers)}): {text}" for cls, text in named.items()
        )
        st.add(known(("attention",), "unsupported.cross_attention_layers", CODE, shown))


def _other_input(st: AnalyzerState, layer: Instance, attn: Instance) -> tuple[str, str] | None:
    """Two forward arguments of ``attn`` its projections read and ``layer``
    gives different values (each shown with its projections), or None."""
    params = forward_parameters(st, attn)
    linears = {id(c): n for n, c in attn.children() if "." not in n and st.role(c) == "linear"}
    reads: dict[str, list[str]] = {}
    for value in st.outputs(attn)[:1]:
        for node in walk(value):
            if node.kind == "module" and id(node.ref) in linears and node.args:
                for read in [p for p in params if _is_input(node.args[0], p)]:  # not o_proj: modules between
                    reads.setdefault(read, []).append(linears[id(node.ref)])
    if len(reads) < 2:
        return None
    for value in st.outputs(layer)[:1]:
        for call in walk(value):
            if call.kind != "module" or call.ref is not attn:
                continue
            given = dict(zip(params, call.args, strict=False)) | dict(call.kwargs)
            first, *others = reads
            for other in others:
                if other in given and first in given and given[other] is not given[first]:
                    shown = [f"{', '.join(dict.fromkeys(reads[p]))} from {p}" for p in sorted((first, other))]
                    return shown[0], shown[1]
    return None


def two_streams(st: AnalyzerState, block: Instance) -> bool:
    """A block that adds a sublayer's output to a forward argument other
    than the one the sublayer reads: two residual streams carried from layer
    to layer (Reformer's reversible residual, ``prev_attn_output +
    attention(hidden_states)``), named with the sublayer and both arguments."""
    params = forward_parameters(st, block)
    children = {id(c): n for n, c in block.children() if "." not in n}
    for state in st.forward(block)[:1]:
        for node in walk(state.value):
            if node.kind != "binop" or node.name != "add" or len(node.args) != 2:
                continue
            for index, side in enumerate(node.args):
                other = node.args[1 - index]
                calls = [
                    n
                    for n in walk(side)
                    if n.kind == "module" and id(n.ref) in children and n.args + n.kwargs
                ]
                added = [p for p in params if _is_input(other, p)]
                main = [c.args[0] if c.args else c.kwarg("hidden_states") for c in calls[:1]]
                read = {n.name for m in main for n in walk(m) if n.kind == "input"} & set(params)
                if calls and added and read and added[0] not in read:
                    name = children[id(calls[0].ref)]
                    st.add(
                        known(
                            ("code.decoder_layers",),
                            "unsupported.reversible_residual",
                            CODE,
                            f"{st.where(block)} adds the output of {name} ({calls[0].ref.class_name}), computed "
                            f"from {', '.join(sorted(read))}, to another input, {added[0]}: two residual streams",
                        )
                    )
                    return True
    return False


def _called_with_attention(st: AnalyzerState, block: Instance, child: Instance) -> bool:
    """One forward path of ``block`` calls both ``child`` and an attention
    (FalconH1's Mamba mixer and attention, summed), not one or the other."""
    for value in st.outputs(block):
        called = [n.ref for n in walk(value) if n.kind == "module"]
        if any(c is child for c in called) and any(st.role(c) == "attention" for c in called):
            return True
    return False


def _called_instead_of_attention(st: AnalyzerState, block: Instance, child: Instance) -> bool:
    """One forward path of ``block`` calls ``child`` and no attention (a
    run-time condition picks it or the attention: LFM2's short convolution
    on the layers its config marks ``conv``)."""
    for value in st.outputs(block):
        called = [n.ref for n in walk(value) if n.kind == "module"]
        if any(c is child for c in called) and not any(st.role(c) == "attention" for c in called):
            return True
    return False


def several_attentions(
    st: AnalyzerState, layer: Instance, names: list[str], explains: tuple[str, ...] = ("code.attention",)
) -> None:
    """A layer with several attention sublayers (each its own projections),
    named with them."""
    shown = ", ".join(f"{n} ({dict(layer.children())[n].class_name})" for n in names)
    st.add(
        known(
            explains,
            "unsupported.several_attentions",
            CODE,
            f"{st.where(layer)} holds {len(names)} attention sublayers: {shown}",
        )
    )


def parallel_lists(st: AnalyzerState, owner: Instance) -> bool:
    """Decoder layers held as parallel module lists of one length (XLM's
    ``attentions[i]``, ``ffns[i]``, ``layer_norm1[i]``), one of attentions
    and one of feed-forwards, rather than one list of layers."""
    lists = {
        name: [i for i in value.attrs.get("items", []) if isinstance(i, Instance)]
        for name, value in owner.attrs.items()
        if isinstance(value, Instance) and value.cls == MODULE_LIST
    }
    kinds = {name: {st.role(i) for i in items} for name, items in lists.items() if items}
    attn = [n for n, k in kinds.items() if k == {"attention"}]
    ffn = [n for n, k in kinds.items() if k and (k <= {"mlp", "moe"} or _projections(st, lists[n]))]
    if not attn or not ffn or len(lists[attn[0]]) != len(lists[ffn[0]]):
        return False
    shown = ", ".join(f"{n} ({len(lists[n])} x {lists[n][0].class_name})" for n in sorted(kinds))
    st.add(
        known(
            ("code.decoder_layers",),
            "unsupported.parallel_layer_lists",
            CODE,
            f"{st.where(owner)}: its layers are parallel module lists indexed together: {shown}",
        )
    )
    return True


def _projections(st: AnalyzerState, items: list[Instance]) -> bool:
    """Each item a module of two linear layers or more (XLM's
    ``TransformerFFN``, its activation a function research reads as other)."""
    return all(
        st.role(i) not in ("attention", "norm") and sum(st.role(c) == "linear" for _, c in i.children()) >= 2
        for i in items
    )


def name_wrapped(st: AnalyzerState, layer: Instance, explains: tuple[str, ...] = ("code.attention",)) -> bool:
    """For each attention one module down (``child.inner``): the residual
    the wrapper adds to the attention output itself, scores and softmax the
    attention computes itself, projections it clamps; True when one is
    named."""
    named = False
    for name, wrapper in layer.children():
        if "." in name:
            continue
        for inner_name, inner in wrapper.children():
            if "." in inner_name or st.role(inner) != "attention":
                continue
            named = _wrapper_residual(st, wrapper, inner, explains) or named
            named = explicit_scores(st, inner, explains) or named
            named = _clamped_projections(st, inner, explains) or named
    return named


def explicit_scores(st: AnalyzerState, attn: Instance, explains: tuple[str, ...]) -> bool:
    """Attention written out (the scores as a product of queries and keys:
    matmul or bmm, then a softmax) with no kernel call, whose scale, softcap,
    sinks and window research reads from a kernel's arguments."""
    for value in st.outputs(attn)[:1]:
        nodes = list(walk(value))
        names = softmax_modules(nodes) | {
            n.name.rsplit(".", 1)[-1] for n in nodes if n.kind in ("binop", "call", "method")
        }
        if "softmax" in names and names & {"matmul", "bmm"}:
            product = "bmm" if "bmm" in names else "matmul"
            said = scores.computed(nodes, _input_projections(st, nodes), st.dims.get("head_dim"))
            st.add(
                known(
                    explains,
                    "unsupported.explicit_attention",
                    CODE,
                    f"{st.where(attn)} computes q @ k^T ({product}) and a softmax itself "
                    "(no attention kernel call)" + (f": {'; '.join(said)}" if said else ""),
                )
            )
            return True
    return False


def _input_projections(st: AnalyzerState, nodes: list[Node]) -> list[Node]:
    """The calls of linear modules that read no other linear call's output."""
    linear = [n for n in nodes if n.kind == "module" and n.ref is not None and st.role(n.ref) == "linear"]
    return [
        c
        for c in linear
        if not any(depends_on(c.args[0] if c.args else None, o) for o in linear if o is not c)
    ]


def _wrapper_residual(
    st: AnalyzerState, wrapper: Instance, inner: Instance, explains: tuple[str, ...]
) -> bool:
    """The wrapper adds its own input to what the attention inside returns
    (and may norm the sum), itself or in a module it gives both (BERT's
    ``BertSelfOutput``): the residual inside the attention sublayer."""
    params = forward_parameters(st, wrapper)
    for value in st.outputs(wrapper)[:1] if params else ():
        calls = [n for n in walk(value) if n.kind == "module" and n.ref is inner]
        for node in walk(value):
            if not calls or not _sums_input(st, node, calls, params[0]):
                continue
            where = "" if node.kind == "binop" else f" in {node.ref.class_name}"
            norms = [  # applied to the sum, not to the attention's input (CPM-Ant's norm before it)
                n.ref.class_name
                for n in walk(value)
                if n.kind == "module" and st.role(n.ref) == "norm" and depends_on(n, node)
            ]
            if node.kind == "module":
                norms += [d.class_name for d in _descendants(node.ref) if st.role(d) == "norm"]
            normed = f", then a norm ({', '.join(sorted(set(norms)))})" if norms else ""
            st.add(
                known(
                    explains,
                    "unsupported.sublayer_residual",
                    CODE,
                    f"{st.where(wrapper)} adds its input {params[0]!r} to the output of "
                    f"{inner.class_name}{where}{normed}",
                )
            )
            return True
    return False


def _sums_input(st: AnalyzerState, node: Node, calls: list[Node], param: str) -> bool:
    """``node`` adds the wrapper's input ``param`` to a value computed from
    the attention ``calls``: an add, or a module given both whose forward
    adds those two arguments."""
    if node.kind == "binop" and node.name == "add":
        args = list(node.args)
    elif (
        node.kind == "module"
        and node.ref is not None
        and node.args
        and node.ref not in [c.ref for c in calls]
    ):
        names = forward_parameters(st, node.ref)
        args = list(node.args[: len(names)])
        if len(args) < 2 or not _module_adds(st, node.ref, names[: len(args)]):
            return False
    else:
        return False
    through = [any(arg is c or depends_on(arg, c) for c in calls) for arg in args]
    return through.count(True) == 1 and any(
        _is_input(arg, param) for arg, t in zip(args, through, strict=True) if not t
    )


def _module_adds(st: AnalyzerState, inst: Instance, names: list[str]) -> bool:
    """``inst``'s forward output holds an add of two of its arguments."""
    for value in st.outputs(inst)[:1]:
        for node in walk(value):
            if node.kind == "binop" and node.name == "add" and len(node.args) == 2:
                sides = [{n.name for n in walk(a) if n.kind == "input"} & set(names) for a in node.args]
                if all(sides) and sides[0] != sides[1]:
                    return True
    return False


def _is_input(value: object, name: str) -> bool:
    """``value`` is the forward argument ``name`` (through casts and
    dropouts at most: no module but a dropout in between)."""
    nodes = list(walk(value)) if isinstance(value, Node) else []
    inputs = [n for n in nodes if n.kind == "input" and n.name == name]
    modules = [n for n in nodes if n.kind == "module" and "Dropout" not in n.ref.class_name]
    return bool(inputs) and not modules


def _clamped_projections(st: AnalyzerState, attn: Instance, explains: tuple[str, ...]) -> bool:
    """Projections of the attention clamped to a range before the scores
    (DBRX's ``clip_qkv``), on the path the config takes."""
    linears = {id(c) for _, c in attn.children() if st.role(c) == "linear"}
    for value in st.outputs(attn)[:1]:
        for node in walk(value):
            if node.kind not in ("method", "call") or not node.args:
                continue
            if node.name.rsplit(".", 1)[-1] not in CLAMPS:
                continue
            bounds = [*node.args[1:], *(v for k, v in node.kwargs if k in ("min", "max"))]
            if all(b is None for b in bounds):
                continue  # clamp(min=None, max=None): DBRX without clip_qkv clamps nothing
            if any(n.kind == "module" and id(n.ref) in linears for n in walk(node.args[0])):
                st.add(
                    known(
                        explains,
                        "unsupported.qkv_clip",
                        CODE,
                        f"{st.where(attn)}: the projections are clamped to a range before the attention "
                        f"({node.name})",
                    )
                )
                return True
    return False


def _routing_without_topk(st: AnalyzerState, name: str, child: Instance, explains: tuple[str, ...]) -> bool:
    """Routed experts (a descendant with 3-D expert weights, or a list of
    MLPs) chosen by code without a top-k of the router scores: the
    functions that choose them are named."""
    experts = [d for d in _descendants(child) if _expert_bank(st, d)]
    if not experts:
        return False
    classes = _classes(child)
    if any(_calls(c.node, "topk") for c in classes):
        return False
    functions = _reachable_functions(classes)
    chooser = ", ".join(f"{f.name} ({module}:{f.lineno})" for f, module in functions) or "its own forward"
    st.add(
        known(
            explains,
            "unsupported.routing_without_topk",
            CODE,
            f"{st.where(child)}: {name} routes to {experts[0].class_name} without a top-k of the router "
            f"scores; the experts are chosen by {chooser}",
        )
    )
    return True


def _expert_bank(st: AnalyzerState, inst: Instance) -> bool:
    if st.role(inst) == "experts":
        return True
    items = [c for n, c in inst.children() if "." in n]
    return len(items) > 1 and all(st.role(c) == "mlp" for c in items)


def _token_mixer(
    st: AnalyzerState,
    block: Instance,
    name: str,
    child: Instance,
    explains: tuple[str, ...],
    instead: bool = False,
) -> bool:
    """A child mixing positions without softmax attention: with a loop over
    positions (a state carried from one to the next) in its code or the
    functions it calls, a recurrent mixer; with a convolution alone, a
    convolutional one."""
    classes = _classes(child)
    loops = [
        f"{where} ({module}:{line})"
        for cls in classes
        for where, module, line in _range_loops(cls.node, cls.module.path.name)
    ]
    loops += [
        f"{fn.name} ({module}:{line})"
        for fn, module in _reachable_functions(classes)
        for _, _, line in _range_loops(fn, module)
    ]
    loops += [
        f"{name} ({module}:{line})"
        for fn, module in [
            *((c.node, c.module.path.name) for c in classes),
            *_reachable_functions(classes),
        ]
        for name, line in _cumulative_sums(fn)
    ]
    convs = [
        f"{path}{attr}"
        for path, inst in [("", child), *((f"{n}.", d) for n, d in _named_descendants(child))]
        for attr, value in inst.attrs.items()
        if _is_convolution(value)
    ]
    if not loops and not convs:
        return False
    beside = " beside the attention" if any(st.role(c) == "attention" for _, c in block.children()) else ""
    if instead:
        beside = " in place of the attention (forward runs one or the other, by a run-time condition)"
    what = f"{st.where(child)}: {name} ({child.class_name}){beside}"
    parts = []
    if convs:
        parts.append(f"a convolution over the positions ({', '.join(convs[:2])})")
    if loops:
        parts.append(
            f"a scan over the positions (a loop or a cumulative sum) in {', '.join(dict.fromkeys(loops[:3]))}"
        )
    kind = "recurrent_mixer" if loops else "convolution_mixer"
    st.add(known(explains, f"unsupported.{kind}", CODE, f"{what} computes {' and '.join(parts)}"))
    return True


def _is_convolution(value: object) -> bool:
    """A torch convolution module (kept by the interpreter as the call that
    constructs it, or an instance of it)."""
    if isinstance(value, Instance):
        return value.class_name in ("Conv1d", "Conv2d")
    return (
        isinstance(value, Node)
        and value.kind == "call"
        and value.name.rsplit(".", 1)[-1] in ("Conv1d", "Conv2d")
    )


def _range_loops(node: ast.AST, module: str) -> Iterator[tuple[str, str, int]]:
    """``for ... in range(...)`` loops in the function or class ``node``:
    (the enclosing function, the file, the line)."""
    functions = [node] if isinstance(node, ast.FunctionDef) else list(ast.walk(node))
    for fn in functions:
        if not isinstance(fn, ast.FunctionDef):
            continue
        for loop in ast.walk(fn):
            if (
                isinstance(loop, ast.For)
                and isinstance(loop.iter, ast.Call)
                and isinstance(loop.iter.func, ast.Name)
                and loop.iter.func.id == "range"
            ):
                owner = fn.name if isinstance(node, ast.FunctionDef) else f"{_class_name(node)}.{fn.name}"
                yield owner, module, loop.lineno
                break


def _cumulative_sums(node: ast.AST) -> Iterator[tuple[str, int]]:
    """``cumsum`` calls in the function or class ``node`` (a chunked scan:
    Mamba-2's ``segment_sum``): (the enclosing function, the line)."""
    functions = [node] if isinstance(node, ast.FunctionDef) else list(ast.walk(node))
    for fn in functions:
        if isinstance(fn, ast.FunctionDef) and _calls(fn, "cumsum"):
            owner = fn.name if isinstance(node, ast.FunctionDef) else f"{_class_name(node)}.{fn.name}"
            line = next(c.lineno for c in ast.walk(fn) if isinstance(c, ast.Call) and _calls(c, "cumsum"))
            yield owner, line


def _class_name(node: ast.AST) -> str:
    return node.name if isinstance(node, ast.ClassDef) else "?"


def _reachable_functions(classes: list[SourceClass]) -> list[tuple[ast.FunctionDef, str]]:
    """Module-level functions the methods of ``classes`` call or refer to
    (a kernel kept as an attribute or bound by ``partial``: xLSTM's
    ``self.sequence_kernel_fn = mlstm_recurrent_sequence_native``), and the
    ones those reach, in the order first reached."""
    found: dict[str, tuple[ast.FunctionDef, str]] = {}
    queue: list[tuple[ast.AST, SourceClass]] = [(c.node, c) for c in classes]
    while queue:
        node, cls = queue.pop(0)
        functions = {f.name: f for f in cls.module.statements if isinstance(f, ast.FunctionDef)}
        for name in ast.walk(node):
            if isinstance(name, ast.Name) and isinstance(name.ctx, ast.Load) and name.id in functions:
                fn = functions[name.id]
                if fn.name not in found:
                    found[fn.name] = (fn, cls.module.path.name)
                    queue.append((fn, cls))
    return list(found.values())


def _calls(node: ast.AST, name: str) -> bool:
    return any(
        isinstance(c, ast.Call)
        and (getattr(c.func, "attr", None) == name or getattr(c.func, "id", None) == name)
        for c in ast.walk(node)
    )


def _classes(inst: Instance) -> list[SourceClass]:
    """The source classes of ``inst`` and its descendants, each once."""
    out: dict[str, SourceClass] = {}
    for node in [inst, *_descendants(inst)]:
        if isinstance(node.cls, SourceClass):
            out.setdefault(node.cls.qualname, node.cls)
    return list(out.values())


def _descendants(inst: Instance) -> list[Instance]:
    return [d for _, d in _named_descendants(inst)]


def _named_descendants(inst: Instance, prefix: str = "", depth: int = 0) -> list[tuple[str, Instance]]:
    out: list[tuple[str, Instance]] = []
    if depth > 6:
        return out
    for name, child in inst.children():
        path = f"{prefix}{name}"
        out.append((path, child))
        out += _named_descendants(child, path + ".", depth + 1)
    return out
