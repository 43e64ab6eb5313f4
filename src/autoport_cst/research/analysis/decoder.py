"""The decoder layer section: the list of decoder layers (and what it holds
when it is not one), layers without softmax attention, the norms of a layer
(kind, bias, offset, epsilon and its key: :mod:`.norms` reads their
arithmetic), their placement (a norm feeding a sublayer: pre; applied to its
output before the residual add: post; both: sandwich), their canonical names,
and the residual structure (sequential or parallel, with a shared or separate
norms; a scalar on the sublayer outputs)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from autoport_cst.research.analysis import mixers
from autoport_cst.research.analysis.config_expressions import (
    add_config_key,
    assigned_in,
    config_expression,
    config_values,
    matching,
    simplified,
)
from autoport_cst.research.analysis.graph import peel_scalars, ranges, scalar_path, strip_casts, unique
from autoport_cst.research.analysis.layer_inputs import added_argument
from autoport_cst.research.analysis.state import AnalyzerState
from autoport_cst.research.findings import CODE, known, unknown
from autoport_cst.research.interp.values import (
    MODULE_LIST,
    FuncRef,
    Instance,
    Node,
    SourceClass,
    merge_returns,
)
from autoport_cst.research.interp.walk import depends_on, walk


def find_backbone(st: AnalyzerState) -> tuple[tuple[str, Instance] | None, str | None, list[Instance]]:
    """The instance holding the decoder layers: a ModuleList whose items
    have an attention and an MLP child; else one its owner's forward runs
    whose items have an attention child and compute their feed-forward
    themselves (``inline_mlp``), whatever the names of list and modules."""
    found = _module_lists(st, lambda owner, items: any(_is_decoder_layer(st, item) for item in items))
    if found[0] is None:
        found = _module_lists(
            st, lambda owner, items: inline_mlp(st, items[0]) and _runs_layers(st, owner, items)
        )
    if found[0] is None:
        found = _module_lists(
            st, lambda owner, items: _wrapped_attention_layer(st, items[0]) and _runs_layers(st, owner, items)
        )
    return found


def _wrapped_attention_layer(st: AnalyzerState, layer: Instance) -> bool:
    """A block with an MLP child and a child holding the attention one level
    down (GPT-Neo's ``attn.attention``)."""
    roles = {st.role(c) for _, c in layer.children()}
    return bool(roles & {"mlp", "moe"}) and "attention" not in roles and bool(wrapped_attention(st, layer))


def wrapped_attention(st: AnalyzerState, layer: Instance) -> list[str]:
    """``child.grandchild`` for each attention one level below a child of
    ``layer``."""
    return [
        f"{name}.{inner} ({child.class_name} around {grand.class_name})"
        for name, child in layer.children()
        if "." not in name
        for inner, grand in child.children()
        if "." not in inner and st.role(grand) == "attention"
    ]


def _module_lists(
    st: AnalyzerState, accept: Callable[[Instance, list[Instance]], bool]
) -> tuple[tuple[str, Instance] | None, str | None, list[Instance]]:
    """The first ModuleList (breadth first from the causal LM) ``accept``
    takes, with its owner, the owner's path and the list's name."""
    queue: list[tuple[str, Instance]] = [("", st.top)]
    seen = 0
    while queue and seen < 64:
        path, inst = queue.pop(0)
        seen += 1
        for name, value in inst.attrs.items():
            if isinstance(value, Instance) and value.cls == MODULE_LIST:
                items = [i for i in value.attrs.get("items", []) if isinstance(i, Instance)]
                if items and accept(inst, items):
                    return (path, inst), name, items
        for name, child in inst.children():
            if "." not in name:
                queue.append((f"{path}.{name}" if path else name, child))
    return None, None, []


def inline_mlp(st: AnalyzerState, layer: Instance) -> bool:
    """A block with one attention child that computes its feed-forward in its
    own forward (projection, activation, projection: OPT's fc1 and fc2)
    rather than in an MLP module."""
    roles = [st.role(c) for _, c in layer.children()]
    return roles.count("attention") == 1 and not {"mlp", "moe"} & set(roles) and st.role(layer) == "mlp"


def inline_mlp_finding(st: AnalyzerState, layer: Instance) -> None:
    """The feed-forward computed by the decoder layer itself, named: its
    projections and where (no MLP module for the spec's MLP section)."""
    linears = [n for n, c in layer.children() if st.role(c) == "linear"]
    st.add(
        unknown(
            "code.mlp",
            CODE,
            f"{st.where(layer)} computes its feed-forward itself ({', '.join(linears)} around an "
            "activation), not in an MLP module",
        )
    )


def _runs_layers(st: AnalyzerState, owner: Instance, items: list[Instance]) -> bool:
    """``owner``'s forward calls the first item of the list."""
    return any(
        node.kind == "module" and node.ref is items[0]
        for state in st.forward(owner)
        for node in walk(state.value)
    )


def first_listed_block(st: AnalyzerState) -> tuple[Instance, Instance] | None:
    """The first item of the first list of modules under the causal LM
    (breadth first), the block ``layer_list_shape`` describes, and the
    module holding the list."""
    queue: list[Instance] = [st.top]
    seen = 0
    while queue and seen < 64:
        inst = queue.pop(0)
        seen += 1
        for value in inst.attrs.values():
            if isinstance(value, Instance) and value.cls == MODULE_LIST:
                items = [i for i in value.attrs.get("items", []) if isinstance(i, Instance)]
                if items:
                    return items[0], inst
        queue += [c for n, c in inst.children() if "." not in n]
    return None


def layer_list_shape(st: AnalyzerState) -> str:
    """What the first list of modules holds, when it is not a list of
    decoder layers with one attention and one MLP module; and whether
    the module owning it adds a second embedding (positions) to the
    token embedding."""
    queue: list[Instance] = [st.top]
    seen = 0
    while queue and seen < 64:
        inst = queue.pop(0)
        seen += 1
        for value in inst.attrs.values():
            if isinstance(value, Instance) and value.cls == MODULE_LIST:
                items = [i for i in value.attrs.get("items", []) if isinstance(i, Instance)]
                if not items:
                    continue
                children = ", ".join(f"{n} ({st.role(c)})" for n, c in items[0].children())
                text = (
                    f": its layers ({items[0].class_name}) hold {children or 'no modules'}, not one "
                    "attention and one MLP module"
                )
                positions = _added_embeddings(st, inst)
                if positions:
                    text += f"; {inst.class_name} adds {', '.join(positions)} to the token embedding"
                    st.add(
                        known(
                            True,
                            "embedding.learned_positions",
                            CODE,
                            f"{inst.class_name}.forward adds {', '.join(positions)} to the token embedding",
                        )
                    )
                return text
        queue += [c for n, c in inst.children() if "." not in n]
    return ""


def _added_embeddings(st: AnalyzerState, owner: Instance) -> list[str]:
    """Embeddings (other than the first) whose output ``owner``'s forward
    adds to another embedding's output."""
    embeds = {id(c): n for n, c in owner.children() if st.role(c) == "embedding"}
    if len(embeds) < 2:
        return []
    found = set()
    for state in st.forward(owner):
        for node in walk(state.value):
            if node.kind == "binop" and node.name == "add":
                sides = [
                    {embeds[id(m.ref)] for m in walk(arg) if m.kind == "module" and id(m.ref) in embeds}
                    for arg in node.args
                ]
                if all(sides) and sides[0] != sides[1]:
                    found |= (sides[0] | sides[1]) - {next(iter(embeds.values()))}
    return sorted(found)


def _is_decoder_layer(st: AnalyzerState, inst: Instance) -> bool:
    roles = {st.role(c) for _, c in inst.children()}
    return "attention" in roles and bool(roles & {"mlp", "moe"})


def mixer_layers(st: AnalyzerState, backbone: Instance, layers_attr: str) -> None:
    """Decoder layers without a softmax attention (hybrids)."""
    layers = st.layers
    others = [
        i
        for i, layer in enumerate(layers)
        if not any(st.role(c) == "attention" for _, c in layer.children())
        and not wrapped_attention(st, layer)
    ]
    if others:
        explains = ("attention.other_mixer_layers",) + (("code.attention",) if others[0] == 0 else ())
        mixers.name_block(st, layers[others[0]], explains)
        kinds = sorted({layers[i].class_name for i in others})
        st.add(
            known(
                tuple(others),
                "attention.other_mixer_layers",
                CODE,
                f"{backbone.class_name}.{layers_attr}: layers {ranges(others)} of {len(layers)} "
                f"have no softmax attention ({', '.join(kinds)})",
            )
        )


def attention_child(st: AnalyzerState) -> bool:
    """The one attention module of the first decoder layer (its name in
    ``st.attn_name``); False, with an unknown, when there is not one."""
    layer0 = st.layers[0]
    children = dict(layer0.children())
    attn_names = [n for n, c in children.items() if st.role(c) == "attention"]
    if len(attn_names) != 1:
        wrapped = wrapped_attention(st, layer0) if not attn_names else []
        if wrapped:
            mixers.name_wrapped(st, layer0)
        elif len(attn_names) > 1:
            mixers.several_attentions(st, layer0, attn_names)
        st.add(
            unknown(
                "code.attention",
                CODE,
                f"{layer0.class_name} has {len(attn_names)} attention modules"
                + (f"; its attention is wrapped in another module: {', '.join(wrapped)}" if wrapped else ""),
            )
        )
        return False
    st.attn_name = attn_names[0]
    return True


def analyze_flow(st: AnalyzerState, layer: Instance) -> None:
    """Norm placement, residual structure and the layer's norms, agreed on
    by every forward path of ``layer``."""
    outs = st.outputs(layer)
    where = st.where(layer)
    if not outs:
        for name in ("norm.placement", "residual.parallel"):
            st.add(unknown(name, CODE, f"{where}: forward could not be followed"))
        return
    verdicts = [_verdict(st, layer, value) for value in outs]
    first = verdicts[0]
    for key in ("placement", "parallel", "multiplier", "norm_names", "norm_roles"):
        values = {repr(v[key]) for v in verdicts}
        if len(values) > 1:
            first[key] = None
            first["why_" + key] = "differs between the paths of forward (a run-time condition)"
    # norms of the decoder layer
    norm_names = first.get("norm_names") or []
    norms = [dict(layer.children())[n] for n in norm_names if n in dict(layer.children())]
    st.result.norm_modules = [f"{st.layer_prefix}0.{n}" for n in norm_names]
    _classify_norms(st, norms, norm_names, layer)
    _canonical_norm_names(st, first.get("norm_roles"), first.get("placement"))
    if first["placement"] is None:
        st.add(unknown("norm.placement", CODE, f"{where}: {first.get('why_placement', '')}"))
    else:
        st.add(known(first["placement"], "norm.placement", CODE, f"{where}: {first['placement_evidence']}"))
    if first["parallel"] is None:
        st.add(unknown("residual.parallel", CODE, f"{where}: {first.get('why_parallel', '')}"))
    else:
        st.add(known(first["parallel"], "residual.parallel", CODE, f"{where}: {first['parallel_evidence']}"))
    if first["multiplier"] is None and "why_multiplier" in first:
        st.add(unknown("residual.multiplier", CODE, f"{where}: {first['why_multiplier']}"))
    else:
        value = first["multiplier"]
        st.add(
            known(
                value,
                "residual.multiplier",
                CODE,
                f"{where}: sublayer outputs scaled by {value:g} before the residual add"
                if value is not None
                else f"{where}: sublayer outputs added unscaled",
            )
        )
        if value is not None:
            _multiplier_source(st, layer, value, where)


def _multiplier_source(st: AnalyzerState, layer: Instance, value: float, where: str) -> None:
    """A residual multiplier the layer computed from several config fields
    (MiniCPM3's ``scale_depth / math.sqrt(num_hidden_layers)``): the port
    computes its ``residual_multiplier`` field from config.json the same way
    (``checkpoint.config_keys``) when ``__init__`` assigns it as arithmetic of
    config fields that gives the value; otherwise it is named
    ``derived_multiplier``."""
    config = st.interp.config
    derived = []
    init = st.interp.find_method(layer.cls, "__init__") if isinstance(layer.cls, SourceClass) else None
    for attr, held in layer.attrs.items():
        if not (isinstance(held, (int, float)) and math.isclose(held, value, rel_tol=1e-9)):
            continue
        keys = sorted(layer.attr_reads.get(attr, frozenset()))
        one = [k for k in keys if config.has(k) and _close(config.read(k, None), value)]
        if not keys or one:
            continue
        source = assigned_in(init[1], attr) if init is not None else None
        text = config_expression(source) if source is not None else None
        if text is not None and matching(text, config_values(config, text), value):
            evidence = f"{where}: self.{attr} = {simplified(text)} = {held:g}"
            add_config_key(st, "residual_multiplier", text, evidence)
        else:
            derived.append(f"self.{attr} = {held:g} from config {', '.join(keys)}")
    if derived:
        st.add(
            known(
                ("residual",),
                "unsupported.derived_multiplier",
                CODE,
                f"{where}: {'; '.join(derived)} (no one config field holds it)",
            )
        )


def _close(field_value: Any, value: float) -> bool:
    return isinstance(field_value, (int, float)) and math.isclose(field_value, value, rel_tol=1e-9)


def _canonical_norm_names(
    st: AnalyzerState, roles: dict[str, str | None] | None, placement: str | None
) -> None:
    """The decoder-layer norms under the names the references load:
    input_layernorm before the attention; post_attention_layernorm before
    the MLP (pre-norm) or on the attention output (post, sandwich);
    pre_feedforward_layernorm before the MLP (sandwich);
    post_feedforward_layernorm on the MLP output."""
    if not roles or placement is None:
        return
    names = st.result.module_names
    if placement == "pre":
        canonical = {"pre_attention": "input_layernorm", "pre_mlp": "post_attention_layernorm"}
        if roles.get("pre_attention") is not None and roles.get("pre_attention") == roles.get("pre_mlp"):
            canonical.pop("pre_mlp")  # one norm feeds both sublayers (parallel residual)
    elif placement == "sandwich":
        canonical = {
            "pre_attention": "input_layernorm",
            "post_attention": "post_attention_layernorm",
            "pre_mlp": "pre_feedforward_layernorm",
            "post_mlp": "post_feedforward_layernorm",
        }
    else:
        canonical = {"post_attention": "post_attention_layernorm", "post_mlp": "post_feedforward_layernorm"}
    for role, name in canonical.items():
        if held := roles.get(role):
            names[name] = held


def _verdict(st: AnalyzerState, layer: Instance, value: Any) -> dict[str, Any]:
    """Placement, parallel residual and multiplier of one forward output."""
    calls = [n for n in walk(value) if n.kind == "module" and n.ref is not None]
    subs = [n for n in calls if st.role(n.ref) in ("attention", "mlp", "moe")]
    attn = [n for n in subs if st.role(n.ref) == "attention"]
    ffn = [n for n in subs if st.role(n.ref) in ("mlp", "moe")]
    entries = {id(n): n for n in subs}  # the call each sublayer's input goes into
    if not ffn and (inline := inline_ffn_calls(st, layer, calls)) is not None:
        ffn = [inline[1]]
        entries[id(inline[1])] = inline[0]
    verdict: dict[str, Any] = {
        "placement": None,
        "parallel": None,
        "multiplier": None,
        "norm_names": [],
        "norm_roles": None,
    }
    if len(attn) != 1 or len(ffn) != 1:
        verdict["why_placement"] = verdict["why_parallel"] = (
            f"found {len(attn)} attention and {len(ffn)} MLP calls in the output"
        )
        return verdict
    S = {"attention": attn[0], "mlp": ffn[0]}
    pre: dict[str, Instance | None] = {}
    post: dict[str, Instance | None] = {}
    mults: dict[str, float] = {}
    for kind, call in S.items():
        pre[kind] = _norm_call(st, _sublayer_input(entries[id(call)]))
        branch = _residual_branch(st, value, call)
        if branch is None and _adds_own_residual(st, entries[id(call)], call):
            branch = call  # the sublayer adds the block's residual itself (BLOOM, MPT's MLP)
        if branch is None:
            verdict["why_placement"] = f"no residual add found around the {kind} output"
            return verdict
        post[kind], mults[kind] = _post_of(st, branch, call)
    _placement(verdict, pre, post)
    _parallel(verdict, {kind: entries[id(call)] for kind, call in S.items()}, pre)
    values = set(mults.values())
    if len(values) == 1:
        m = values.pop()
        verdict["multiplier"] = None if math.isclose(m, 1.0) else m
    else:
        verdict["why_multiplier"] = f"different scalars on the sublayer outputs: {mults}"
    return verdict


def _adds_own_residual(st: AnalyzerState, entry: Node, call: Node) -> bool:
    """The sublayer ``call`` is given the block's residual and adds it to
    its output itself: the argument it adds is the value its input norm
    reads (``attn(norm(h), h)`` computes ``h + attn'(norm(h))``). A residual
    taken after the norm (BLOOM's ``apply_residual_connection_post_layernorm``)
    is not that; the block is then named (``block_features.sublayer_residual``)."""
    if entry is not call:
        return False
    added = added_argument(st, call)
    normed = strip_casts(_sublayer_input(call))
    if added is None or not (isinstance(normed, Node) and normed.kind == "module" and normed.args):
        return False
    if _norm_call(st, normed) is not normed.ref:
        return False
    residual, norm_input = strip_casts(added[1]), strip_casts(normed.args[0])
    return residual is norm_input or residual == norm_input


def _sublayer_input(call: Node) -> Any:
    return call.args[0] if call.args else call.kwarg("hidden_states")


def inline_ffn_calls(st: AnalyzerState, layer: Instance, calls: list[Node]) -> tuple[Node, Node] | None:
    """The feed-forward a layer computes itself: its own two projections,
    the second reading the first (OPT's ``fc2(act(fc1(x)))``), as (the
    call its input goes into, the call giving its output)."""
    own = {id(c) for _, c in layer.children() if st.role(c) == "linear"}
    linears = unique([n for n in calls if id(n.ref) in own])
    if len(linears) != 2 or len({id(n.ref) for n in linears}) != 2:
        return None
    first, second = linears
    if depends_on(_sublayer_input(first), second):
        first, second = second, first
    return (first, second) if depends_on(_sublayer_input(second), first) else None


def _placement(
    verdict: dict[str, Any], pre: dict[str, Instance | None], post: dict[str, Instance | None]
) -> None:
    """The norms around each sublayer (``pre``: on its input, ``post``: on its
    output before the residual add): their names and roles, and the placement
    they make (pre, post, sandwich; mixed is not classified)."""
    names = []
    for kind in ("attention", "mlp"):
        for norm in (pre[kind], post[kind]):
            if norm is not None and norm.name and norm.name not in names:
                names.append(norm.name)
    verdict["norm_names"] = names
    verdict["norm_roles"] = {
        f"{when}_{kind}": (norm.name if norm is not None else None)
        for kind in ("attention", "mlp")
        for when, norm in (("pre", pre[kind]), ("post", post[kind]))
    }
    has_pre = {k: v is not None for k, v in pre.items()}
    has_post = {k: v is not None for k, v in post.items()}
    desc = ", ".join(
        f"{k}: {'norm ' + (before.name or '?') + ' before' if before else 'no norm before'}"
        f"{', norm ' + (after.name or '?') + ' on the output' if after else ''}"
        for k, before, after in ((k, pre[k], post[k]) for k in ("attention", "mlp"))
    )
    if all(has_pre.values()) and not any(has_post.values()):
        verdict["placement"] = "pre"
    elif all(has_post.values()) and not any(has_pre.values()):
        verdict["placement"] = "post"
    elif all(has_pre.values()) and all(has_post.values()):
        verdict["placement"] = "sandwich"
    else:
        verdict["why_placement"] = f"mixed norm placement ({desc})"
    verdict["placement_evidence"] = desc


def _parallel(verdict: dict[str, Any], S: dict[str, Node], pre: dict[str, Instance | None]) -> None:
    """Sequential sublayers, or attention and MLP reading the same input
    (through one norm or two) and summed."""
    mlp_arg = S["mlp"].args[0] if S["mlp"].args else S["mlp"].kwarg("hidden_states")
    if depends_on(mlp_arg, S["attention"]):
        verdict["parallel"] = "none"
        verdict["parallel_evidence"] = "the MLP input is computed from the attention output"
    else:
        shared = pre["attention"] is not None and pre["attention"] is pre["mlp"]
        attn_arg = S["attention"].args[0] if S["attention"].args else S["attention"].kwarg("hidden_states")
        shared = shared or attn_arg is mlp_arg
        verdict["parallel"] = "shared_norm" if shared else "separate_norms"
        verdict["parallel_evidence"] = "attention and MLP read the same input and are summed" + (
            " (one norm)" if shared else " (separate norms)"
        )


def _norm_call(st: AnalyzerState, value: Any) -> Instance | None:
    value = strip_casts(value)
    for _ in range(8):
        if isinstance(value, Node) and value.kind == "module" and value.ref is not None:
            role = st.role(value.ref)
            if role == "norm":
                return value.ref
            if role == "dropout" and value.args:
                value = strip_casts(value.args[0])
                continue
        return None
    return None


def _residual_branch(st: AnalyzerState, value: Any, call: Node) -> Any:
    """The operand that carries ``call``'s output into the residual add
    closest to it; an add inside a source function the forward calls on
    tensors is seen by running it (Falcon's ``dropout_add(x, residual, ...)``
    returns ``residual + dropout(x)``)."""
    candidates = []
    for anchor, node in _adds(st, value):
        a_in, b_in = depends_on(node.args[0], call), depends_on(node.args[1], call)
        if a_in == b_in:
            continue
        branch = node.args[0] if a_in else node.args[1]
        other_subs = [
            n
            for n in walk(branch)
            if n.kind == "module"
            and n is not call
            and st.role(n.ref) in ("attention", "mlp", "moe")
            and depends_on(n, call)
        ]
        if not other_subs:
            candidates.append((anchor, branch))
    for anchor, branch in candidates:  # the innermost add: no other candidate inside its branch
        if not any(other is not anchor and depends_on(branch, other) for other, _ in candidates):
            return branch
    return None


def _adds(st: AnalyzerState, value: Any) -> list[tuple[Node, Node]]:
    """Every add of ``value`` as (the node standing for it in ``value``, the
    add): an add itself, or a source function's call whose run returns an
    add with one of the call's operands as it was given (Falcon's
    ``residual + dropout(x)``; not Beam's ``depth_scaled_residual_add``,
    which scales the residual too)."""
    found = []
    for node in walk(value):
        if node.kind == "binop" and node.name == "add":
            found.append((node, node))
        elif node.kind == "func" and isinstance(node.ref, FuncRef):
            operands = [*node.args, *dict(node.kwargs).values()]
            returned = merge_returns(
                st.interp.call_function(node.ref.module, node.ref.node, list(node.args), dict(node.kwargs))
            )
            if (
                isinstance(returned, Node)
                and returned.kind == "binop"
                and returned.name == "add"
                and any(any(arg is given for given in operands) for arg in returned.args)
            ):
                found.append((node, returned))
    return found


def _post_of(st: AnalyzerState, branch: Any, call: Node) -> tuple[Instance | None, float]:
    """A norm applied to the sublayer output, and a scalar factor."""
    factor, _, reached = scalar_path(branch, lambda v: v is call)
    if reached:
        return None, factor
    value = branch
    factor = 1.0
    for _ in range(8):
        f, _, _ = scalar_path(value, lambda v: isinstance(v, Node) and v.kind == "module")
        factor *= f
        value = peel_scalars(value)
        if isinstance(value, Node) and value.kind == "module" and value.ref is not None:
            role = st.role(value.ref)
            if role == "norm" and value.args and depends_on(value.args[0], call):
                inner_factor, _, _ = scalar_path(value.args[0], lambda v: v is call)
                return value.ref, factor * inner_factor
            if role == "dropout" and value.args:
                value = value.args[0]
                continue
        break
    return None, factor


def _classify_norms(st: AnalyzerState, norms: list[Instance], names: list[str], layer: Instance) -> None:
    if not norms:
        st.add(
            unknown(
                "norm.kind", CODE, f"{layer.class_name}: no norm found in front of or after the sublayers"
            )
        )
        return
    infos = [st.norm_info(n) for n in norms]
    for field_name in ("kind", "bias", "unit_offset"):
        values = {info[field_name] for info in infos}
        evidence = "; ".join(
            f"{name}: {info['evidence'] or 'unclassified'}" for name, info in zip(names, infos, strict=False)
        )
        if None in values or len(values) != 1:
            st.add(unknown(f"norm.{field_name}", CODE, evidence or "norm forward not classified"))
        else:
            st.add(known(values.pop(), f"norm.{field_name}", CODE, evidence))
    affine = {info["affine"] for info in infos}
    if affine == {False}:
        st.add(known(False, "code.norm_affine", CODE, "the decoder norms have no weight (non-parametric)"))
    eps_keys = {info["eps_key"] for info in infos}
    eps = {info["eps"] for info in infos}
    if len(eps_keys) == 1 and None not in eps_keys:
        key = eps_keys.pop()
        st.add(known(key, "norm.eps_key", CODE, f"{norms[0].class_name}(eps=config.{key})"))
    elif eps_keys == {None} and len(eps) == 1 and None not in eps:
        fixed = float(next(iter(eps)))
        st.add(known(fixed, "norm.fixed_eps", CODE, _fixed_eps_evidence(norms[0], fixed)))
    else:
        st.add(unknown("norm.eps_key", CODE, f"norm eps read from {sorted(map(str, eps_keys))}"))
    if len(eps) == 1 and None not in eps:
        st.add(known(eps.pop(), "norm.eps", CODE, f"{norms[0].class_name} eps argument"))


def _fixed_eps_evidence(norm: Instance, value: float) -> str:
    """A norm epsilon no config field gives: the literal the construction
    passes, or the class's default (its signature) when it passes none."""
    return (
        f"{norm.class_name}: the epsilon {value:g} is fixed in the code (a literal, or the class's "
        "default when no eps is passed), not read from a config field"
    )
