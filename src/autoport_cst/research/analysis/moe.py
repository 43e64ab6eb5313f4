"""The MoE section: which decoder layers route to experts and which keep a
dense MLP, and the routed block: the top-k (its k), the score function
(softmax or sigmoid, before or after the top-k), renormalisation, router and
routing biases, a routed scaling factor, the experts (a list of MLPs or 3-D
parameters; their computation classified by :func:`.mlp.mlp_facts`), shared
experts and their gate, and what the spec cannot describe (group-limited
routing, other expert computations, router-weighted expert inputs)."""

from __future__ import annotations

import ast
import math
from typing import Any

from autoport_cst.research.analysis import mlp, routing_weights
from autoport_cst.research.analysis.graph import number, ranges, strip_casts, strip_shape, vector_shape
from autoport_cst.research.analysis.moe_experts import routed_among, stacked_shared, uncast
from autoport_cst.research.analysis.state import AnalyzerState
from autoport_cst.research.findings import CODE, known, unknown
from autoport_cst.research.interp.values import MODULE_LIST, UNKNOWN, Instance, Node, Param
from autoport_cst.research.interp.walk import depends_on, walk


def split_layers(st: AnalyzerState) -> str | None:
    """The feed-forward child of the decoder layers, and which layers hold a
    dense MLP (``result.dense_layers``) or a routed block (``moe_layers``);
    None, with an unknown, when a layer has no single MLP or MoE module."""
    kinds_per_layer: list[str | None] = []
    ffn_name = None
    for layer in st.layers:
        children = dict(layer.children())
        names = [n for n, c in children.items() if st.role(c) in ("mlp", "moe")]
        if len(names) != 1:
            kinds_per_layer.append(None)
            continue
        ffn_name = ffn_name or names[0]
        kinds_per_layer.append(st.role(children[names[0]]))
    st.result.moe_layers = [i for i, k in enumerate(kinds_per_layer) if k == "moe"]
    st.result.dense_layers = [i for i, k in enumerate(kinds_per_layer) if k == "mlp"]
    if None in kinds_per_layer or ffn_name is None:
        st.add(unknown("mlp.kind", CODE, "a decoder layer has no single MLP or MoE module"))
        return None
    if st.result.moe_layers and st.result.dense_layers:
        st.add(
            known(
                st.result.dense_layers,
                "code.dense_layers",
                CODE,
                f"dense MLP on layers {ranges(st.result.dense_layers)}, MoE on {ranges(st.result.moe_layers)}",
            )
        )
    return ffn_name


def no_routed_block(st: AnalyzerState) -> None:
    st.add(known(None, "moe", CODE, "no top-k routed block in any decoder layer"))


def analyze(st: AnalyzerState, block: Instance, prefix: str) -> None:
    """Classify the routed block ``block`` (state-dict prefix ``prefix``)."""
    where = st.where(block)
    children = list(block.children())
    routing_owner, routing_out = _routing_forward(st, block, children)
    facts: dict[str, Any] = {}
    rwhere = st.where(routing_owner) if routing_owner else where
    if routing_owner is not None and routing_out is not None:  # (found together)
        facts.update(_routing(st, routing_owner, routing_out, block))
    experts, experts_name, stacked_shared = _experts(st, block)
    num_experts, intermediate, expert_facts = _expert_sizes(st, experts, facts)
    st.result.router_modules = [
        prefix + n
        for n, c in children
        if c is routing_owner or (st.base_module(c) == "Linear" and c.args.get("out_features") == num_experts)
    ]
    _routing_findings(st, facts, num_experts, experts_name, intermediate, where, rwhere)
    _shared_experts(st, children, experts_name, where, stacked_shared)
    if expert_facts is not None:
        mlp.mlp_findings(
            st, expert_facts, st.where(experts[0] if isinstance(experts, list) else experts), "mlp"
        )
    if isinstance(experts, Instance):
        st.add(
            known(
                True,
                "code.stacked_experts",
                CODE,
                f"{where}: experts stored as 3-D parameters {[n for n, _ in experts.params()]}",
            )
        )
    if not st.result.dense_layers:
        st.add(known(None, "mlp.intermediate_size", CODE, f"{where}: no dense MLP layer"))
    _router_dtype(st, children, routing_owner, rwhere)
    if (
        facts.get("routed_scaling") is None
        and not facts.get("routed_scaling_learned")
        and experts is not None
    ):
        scaled = _block_scaling(st, block, experts)
        if scaled is not None:
            facts["routed_scaling"], facts["routed_scaling_evidence"] = scaled
    _extras(st, facts, rwhere, where, expert_facts, experts)
    if isinstance(experts, Instance):
        _expert_input(st, block, experts, where)
        _output_norm(st, block, experts, where)


def _routing_findings(
    st: AnalyzerState,
    facts: dict[str, Any],
    num_experts: int | None,
    experts_name: str | None,
    intermediate: int | None,
    where: str,
    rwhere: str,
) -> None:
    """The routed block's sizes and routing: the number of experts (held by
    ``experts_name``), top-k, the experts' width, the router's activation,
    renormalisation and biases; unknown where the code did not say."""
    values = {
        "moe.num_experts": (num_experts, f"{where}: {experts_name} holds {num_experts} experts"),
        "moe.top_k": (facts.get("top_k"), f"{rwhere}: topk(k={facts.get('top_k')})"),
        "moe.intermediate_size": (intermediate, f"{where}: expert projection width {intermediate}"),
        "moe.router_activation": (
            facts.get("activation"),
            f"{rwhere}: {facts.get('activation_evidence', '')}",
        ),
        "moe.norm_topk_prob": (facts.get("renorm"), f"{rwhere}: {facts.get('renorm_evidence', '')}"),
        "moe.router_bias": (facts.get("router_bias"), f"{rwhere}: {facts.get('router_bias_evidence', '')}"),
        "moe.routing_bias": (
            facts.get("routing_bias"),
            f"{rwhere}: {facts.get('routing_bias_evidence', '')}",
        ),
    }
    for name, (value, evidence) in values.items():
        if value is None:
            st.add(unknown(name, CODE, evidence))
        else:
            st.add(known(value, name, CODE, evidence))
    if facts.get("routing_bias_on_logits"):
        st.add(
            known(
                True,
                "unsupported.routing_bias_on_logits",
                CODE,
                f"{rwhere}: {facts['routing_bias_on_logits']}",
            )
        )


def _router_dtype(
    st: AnalyzerState, children: list[tuple[str, Instance]], routing_owner: Instance | None, rwhere: str
) -> None:
    """Whether the router's weight is created in float32 or the model dtype."""
    router_params = [p for _, c in children if c is routing_owner for _, p in c.params()]
    router_f32 = any(p.float32 for p in router_params)
    st.add(
        known(
            router_f32,
            "code.router_param_float32",
            CODE,
            f"{rwhere}: router weight created in {'float32' if router_f32 else 'the model dtype'}",
        )
    )


def _routing_forward(
    st: AnalyzerState, block: Instance, children: list[tuple[str, Instance]]
) -> tuple[Instance | None, Any]:
    """The forward with the top-k call (the block's or a child's), and its
    output."""
    for owner in [block] + [c for _, c in children if not c.is_external]:
        for value in [path.value for path in st.forward(owner)]:
            if any(n.kind in ("call", "method") and n.name.rsplit(".", 1)[-1] == "topk" for n in walk(value)):
                return owner, value
    return None, None


def _experts(st: AnalyzerState, block: Instance) -> tuple[Any, str | None, list[tuple[str, Instance]]]:
    """The experts: a list of MLPs, or a module of 3-D parameters (the one
    that selects per expert among several: moe_experts.routed_among), the
    last one declared, its attribute name, and the other modules of 3-D
    parameters (shared experts)."""
    found: list[tuple[int, Any, str]] = []
    stacked: list[tuple[str, Instance]] = []
    for at, (name, child) in enumerate(block.attrs.items()):
        if isinstance(child, Instance) and child.cls == MODULE_LIST:
            items = child.attrs.get("items", [])
            if len(items) > 1 and all(isinstance(i, Instance) and st.role(i) == "mlp" for i in items[:2]):
                found.append((at, items, name))
        elif isinstance(child, Instance) and st.role(child) == "experts":
            stacked.append((name, child))
    routed, shared = routed_among(st, stacked)
    if routed is not None:
        found.append((list(block.attrs).index(routed[0]), routed[1], routed[0]))
    if not found:
        return None, None, shared
    _, experts, experts_name = max(found, key=lambda f: f[0])
    return experts, experts_name, shared


def _expert_sizes(
    st: AnalyzerState, experts: Any, facts: dict[str, Any]
) -> tuple[int | None, int | None, dict[str, Any] | None]:
    """The number of experts (else the router's width), their width, and
    what one expert computes."""
    num_experts = None
    intermediate = None
    expert_facts = None
    if isinstance(experts, list):
        num_experts = len(experts)
        expert_facts = mlp.mlp_facts(st, experts[0])
        intermediate = expert_facts["intermediate"]
    elif isinstance(experts, Instance):
        shapes = [p.shape for _, p in experts.params() if p.shape and len(p.shape) == 3]
        firsts = {s[0] for s in shapes}
        num_experts = firsts.pop() if len(firsts) == 1 else None
        expert_facts = mlp.mlp_facts(st, experts)
        intermediate = _expert_width(st, experts, shapes)
    if num_experts is None:
        num_experts = facts.get("router_width")
    return num_experts, intermediate, expert_facts


def _shared_experts(
    st: AnalyzerState,
    children: list[tuple[str, Instance]],
    experts_name: str | None,
    where: str,
    stacked: list[tuple[str, Instance]],
) -> None:
    """Always-on experts (other MLP children) and a width-1 gate on them;
    ``stacked``: modules of several shared experts' 3-D parameters, which
    no spec field describes (a shared expert is one MLP)."""
    shared = [
        (n, c) for n, c in children if n != experts_name and "." not in n and _feed_forward_module(st, c)
    ]
    if stacked:
        stacked_shared(st, stacked, len(shared), where)
        return
    gates = [(n, c) for n, c in children if st.base_module(c) == "Linear" and c.args.get("out_features") == 1]
    st.add(
        known(
            len(shared),
            "moe.shared_experts",
            CODE,
            f"{where}: "
            + (
                ", ".join(f"{n} (width {mlp.mlp_facts(st, c)['intermediate']})" for n, c in shared)
                or "no always-on expert"
            ),
        )
    )
    if shared:
        width = mlp.mlp_facts(st, shared[0][1])["intermediate"]
        if width is not None:
            st.add(known(width, "code.shared_expert_intermediate", CODE, f"{where}: {shared[0][0]} width"))
    has_gate = bool(gates and shared)
    st.add(
        known(
            has_gate,
            "moe.shared_expert_gate",
            CODE,
            f"{where}: "
            + (
                f"{gates[0][0]} (width 1) gates the shared expert"
                if has_gate
                else "no gate on a shared expert"
            ),
        )
    )


def _feed_forward_module(st: AnalyzerState, child: Instance) -> bool:
    """An MLP by its role, or by what it computes: projections combined by
    the clamped SwiGLU (which calls no activation function)."""
    if st.role(child) == "mlp":
        return True
    if child.is_external or st.role(child) != "other":
        return False
    return mlp.mlp_facts(st, child).get("glu") is not None


def _block_scaling(st: AnalyzerState, block: Instance, experts: Any) -> tuple[float, str] | None:
    """A constant the block multiplies the experts' combined output by
    (MiniMax M3: ``experts(...) * routed_scaling_factor``), not 1."""
    modules = experts if isinstance(experts, list) else [experts]
    for value in st.outputs(block)[:1]:
        for n in walk(value):
            if n.kind != "binop" or n.name != "mul" or len(n.args) != 2:
                continue
            for x, y in (n.args, n.args[::-1]):
                if (
                    number(y)
                    and not isinstance(y, bool)
                    and not math.isclose(float(y), 1.0)
                    and any(m.kind == "module" and any(m.ref is e for e in modules) for m in walk(x))
                ):
                    return float(y), f"the experts' output multiplied by {float(y):g} in {st.where(block)}"
    return None


def _routing(st: AnalyzerState, owner: Instance, value: Any, block: Instance | None = None) -> dict[str, Any]:
    """What the routing forward computes around its top-k."""
    nodes = list(walk(value))
    topk = next(n for n in nodes if n.kind in ("call", "method") and n.name.rsplit(".", 1)[-1] == "topk")
    facts: dict[str, Any] = {}
    k = topk.args[1] if len(topk.args) > 1 else topk.kwarg("k")
    facts["top_k"] = k if isinstance(k, int) else None
    scores = topk.args[0] if topk.args else None
    before = list(walk(scores))
    _score_function(nodes, before, topk, facts)
    _router_projection(st, before, facts, owner)
    added = [
        n
        for n in before
        if n.kind == "binop"
        and n.name == "add"
        and any(isinstance(x, Node) and x.kind == "param" for x in map(strip_casts, n.args))
    ]
    facts["routing_bias"] = bool(added)
    facts["routing_bias_evidence"] = (
        "a per-expert parameter is added to the scores before top-k"
        if added
        else "top-k of the scores as computed"
    )
    if not added:
        elsewhere = _routing_bias_elsewhere(st, owner, block, before, facts.get("router_width"))
        if elsewhere:
            facts["routing_bias"] = True
            facts["routing_bias_evidence"] = elsewhere
    if facts["routing_bias"] and str(facts.get("activation_evidence", "")).startswith("top-k of the logits"):
        # the port chooses by scores + bias (the activation first): not the same experts
        facts["routing_bias_on_logits"] = (
            "a per-expert bias is added to the router logits before top-k, and the activation "
            "is applied to the k chosen values only"
        )
    facts.update(routing_weights.routed_scaling(nodes, topk))
    facts.update(_group_routing(nodes, topk, facts.get("router_width")))
    return facts


def _score_function(nodes: list[Node], before: list[Node], topk: Node, facts: dict[str, Any]) -> None:
    """softmax or sigmoid of the router logits (before the top-k, or of the
    k values after it), and whether the k weights are renormalised."""
    fn_before = [
        n.name.rsplit(".", 1)[-1]
        for n in before
        if n.kind in ("call", "method") and n.name.rsplit(".", 1)[-1] in ("softmax", "sigmoid")
    ]
    after_softmax = [
        n
        for n in nodes
        if n.kind in ("call", "method") and n.name.rsplit(".", 1)[-1] == "softmax" and depends_on(n, topk)
    ]
    if fn_before:
        facts["activation"] = "softmax" if fn_before[0] == "softmax" else "sigmoid"
        facts["activation_evidence"] = f"{fn_before[0]} over the router logits, then top-k"
    elif after_softmax:
        facts["activation"] = "softmax"
        facts["activation_evidence"] = "top-k of the logits, then softmax over the k values"
    elif any(
        n.kind in ("call", "method") and n.name.rsplit(".", 1)[-1] == "sigmoid" and depends_on(n, topk)
        for n in nodes
    ):
        # sigmoid is monotonic: the same experts as sigmoid first, then top-k
        facts["activation"] = "sigmoid"
        facts["activation_evidence"] = "top-k of the logits, then sigmoid of the k values"
    else:
        facts["activation_evidence"] = "no softmax or sigmoid around the top-k"
    renorm, renorm_evidence = routing_weights.renormalisation(nodes, topk) or (
        False,
        "top-k weights used as computed",
    )
    if after_softmax and not fn_before:
        renorm, renorm_evidence = True, "softmax over the top-k values sums to 1"
    if fn_before or after_softmax or facts.get("activation") == "sigmoid":
        facts["renorm"], facts["renorm_evidence"] = renorm, renorm_evidence


def _router_projection(
    st: AnalyzerState, before: list[Node], facts: dict[str, Any], owner: Instance | None = None
) -> None:
    """The projection producing the router logits: its bias and width. A
    router that subclasses torch's Linear and projects with
    ``super().forward(x)`` (Llama 4's ``Llama4Router(nn.Linear)``) is read as
    that Linear: the arguments its constructor passed to ``nn.Linear``."""
    proj = [n for n in before if n.kind == "call" and n.name.endswith(".linear")]
    lin = [
        n for n in before if n.kind == "module" and n.ref is not None and st.base_module(n.ref) == "Linear"
    ]
    if not proj and not lin and owner is not None and _projects_as_linear(st, owner, before):
        facts["router_bias"] = bool(owner.args.get("bias"))
        facts["router_bias_evidence"] = (
            f"router {owner.name}(nn.Linear, bias={owner.args.get('bias')}): super().forward(x)"
        )
        facts["router_width"] = owner.args.get("out_features")
        return
    if proj:
        bias = proj[0].args[2] if len(proj[0].args) > 2 else proj[0].kwarg("bias")
        facts["router_bias"] = isinstance(bias, Node) and bias.kind == "param"
        facts["router_bias_evidence"] = (
            f"logits = linear(x, weight, bias={'param' if facts['router_bias'] else 'none'})"
        )
        weight = proj[0].args[1] if len(proj[0].args) > 1 else None
        if isinstance(weight, Node) and isinstance(weight.ref, Param) and weight.ref.shape:
            facts["router_width"] = weight.ref.shape[0]
    elif lin:
        facts["router_bias"] = bool(lin[0].ref.args.get("bias"))
        facts["router_bias_evidence"] = f"router {lin[0].ref.name}(bias={lin[0].ref.args.get('bias')})"
        facts["router_width"] = lin[0].ref.args.get("out_features")
    else:
        facts["router_bias_evidence"] = "router projection not found"


def _projects_as_linear(st: AnalyzerState, owner: Instance, before: list[Node]) -> bool:
    """Whether ``owner`` is a subclass of torch's Linear whose logits come
    from its base class's forward (``super().forward(x)``)."""
    return st.base_module(owner) == "Linear" and any(
        n.kind == "call" and n.name == "super.forward" for n in before
    )


def _output_norm(st: AnalyzerState, block: Instance, experts: Instance, where: str) -> None:
    """A norm the MoE block applies to its own output, after the experts
    (A.X-K1's post_mlp_layernorm): no spec field describes it."""
    for out in st.outputs(block):
        nodes = list(walk(out))
        routed = [n for n in nodes if n.kind == "module" and n.ref is experts]
        for n in nodes:
            if (
                n.kind == "module"
                and isinstance(n.ref, Instance)
                and st.role(n.ref) == "norm"
                and n.args
                and any(depends_on(n.args[0], r) for r in routed)
            ):
                st.add(
                    known(
                        "a norm on the MoE output",
                        "unsupported.moe.output_norm",
                        CODE,
                        f"{where}: {n.ref.name} normalises the MoE block's output (experts and shared "
                        "experts) before the residual add",
                    )
                )
                return


def _expert_input(st: AnalyzerState, block: Instance, experts: Instance, where: str) -> None:
    """Experts that read the router-weighted input (Llama 4: experts(x *
    score), their outputs summed unweighted): ``moe.expert_input_scaling``.
    Outputs weighted by the scores as well stay unsupported (no spec field
    describes both)."""
    for out in st.outputs(block):
        nodes = list(walk(out))
        topks = [n for n in nodes if n.kind in ("call", "method") and n.name.rsplit(".", 1)[-1] == "topk"]
        routed = [n for n in nodes if n.kind == "module" and n.ref is experts]
        scores = [
            n
            for n in nodes
            if n.kind == "module"
            and isinstance(n.ref, Instance)
            and n.ref is not experts
            and st.role(n.ref) in ("router", "linear")
        ]
        for call in routed:
            first = call.args[0] if call.args else call.kwarg("hidden_states")
            if not (isinstance(first, Node) and any(depends_on(first, t) for t in topks + scores)):
                continue
            if _weighted_output(nodes, call, topks + scores):
                st.add(
                    known(
                        "router-weighted expert input and output",
                        "unsupported.moe.expert_input_scaling",
                        CODE,
                        f"{where}: the experts read the hidden states multiplied by the router "
                        "scores, and their outputs are weighted by the scores too",
                    )
                )
                return
            st.add(
                known(
                    True,
                    "moe.expert_input_scaling",
                    CODE,
                    f"{where}: the experts read the hidden states multiplied by the router "
                    "scores; their outputs are summed unweighted",
                )
            )
            return


def _weighted_output(nodes: list[Node], call: Node, routing: list[Node]) -> bool:
    """Whether a product of the experts' output ``call`` and something the
    routing computed is taken after the experts."""
    for n in nodes:
        if n.kind != "binop" or n.name != "mul" or len(n.args) != 2:
            continue
        sides = [a for a in n.args if isinstance(a, Node)]
        if len(sides) != 2:
            continue
        for this, other in ((sides[0], sides[1]), (sides[1], sides[0])):
            if (
                depends_on(this, call)
                and not depends_on(other, call)
                and any(depends_on(other, r) for r in routing)
            ):
                return True
    return False


def _extras(
    st: AnalyzerState,
    facts: dict[str, Any],
    rwhere: str,
    where: str,
    expert_facts: dict[str, Any] | None,
    experts: Any,
) -> None:
    """The routed scaling factor, the dense layers, and what the spec cannot
    describe (``unsupported.moe.*`` findings: the plan refuses them)."""
    if "routed_scaling_evidence" in facts:
        scaling = facts.get("routed_scaling")
        evidence = f"{rwhere}: {facts['routed_scaling_evidence']}"
        if facts.get("routed_scaling_learned"):
            st.add(unknown("moe.routed_scaling_factor", CODE, evidence))
        else:
            st.add(known(scaling, "moe.routed_scaling_factor", CODE, evidence))
    dense = tuple(st.result.dense_layers) if st.result.moe_layers and st.result.dense_layers else None
    st.add(
        known(
            dense,
            "moe.dense_layers",
            CODE,
            f"{where}: "
            + (
                f"dense MLP instead of experts on layers {ranges(list(dense))}"
                if dense
                else "experts on every layer"
            ),
        )
    )
    _group_findings(st, facts, rwhere)
    if expert_facts is not None and (expert_facts["kind"] is None or expert_facts["act"] is None):
        ewhere = st.where(experts[0] if isinstance(experts, list) else experts)
        st.add(
            known(
                "expert computation",
                "unsupported.moe.expert_mlp",
                CODE,
                f"{ewhere}: the experts are not act(x W_gate) * (x W_up) W_down with a known activation "
                f"({expert_facts['evidence'] or 'not classified'})",
            )
        )


def _expert_width(st: AnalyzerState, experts: Instance, shapes: list[tuple]) -> int | None:
    keys = [
        v
        for k, v in experts.attrs.items()
        if isinstance(v, int) and any("intermediate" in r for r in experts.attr_reads.get(k, ()))
    ]
    hidden = st.dims.get("hidden_size")
    if len(set(keys)) == 1:
        return keys[0]
    dims = {d for s in shapes for d in s[1:] if d != hidden}
    if len(dims) == 2:
        small, big = sorted(dims)
        if big == 2 * small:
            return small
    if len(dims) == 1:
        return dims.pop()
    return None


def _routing_bias_elsewhere(
    st: AnalyzerState, owner: Instance, block: Instance | None, before: list[Any], experts: int | None
) -> str | None:
    """A per-expert vector added to the scores that is not a parameter of
    the router's forward: a buffer (``nn.Buffer``), a vector the MoE block
    passes in, or the output of a submodule that adds one (ERNIE's
    ``moe_statics``). Returns the evidence, or None."""
    for n in before:
        if n.kind == "module" and isinstance(n.ref, Instance) and st.base_module(n.ref) != "Linear":
            for out in st.outputs(n.ref):
                if any(
                    m.kind == "binop"
                    and m.name == "add"
                    and any(isinstance(x, Node) and x.kind == "param" for x in map(strip_shape, m.args))
                    for m in walk(out)
                ):
                    return (
                        f"{n.ref.class_name} (self.{n.name}) adds a per-expert parameter to the scores "
                        "before top-k"
                    )
        if n.kind != "binop" or n.name != "add":
            continue
        for x in map(strip_casts, n.args):
            if isinstance(x, Node) and x.kind == "input":
                holders = [i for i in (owner, block) if isinstance(i, Instance)]
                if any(
                    name == x.name and p.shape and max(p.shape) == experts and vector_shape(p.shape)
                    for i in holders
                    for name, p in i.params()
                ) or any(x.name in _buffers(i) for i in holders):
                    return f"the per-expert vector {x.name} is passed in and added to the scores before top-k"
            elif x is UNKNOWN:
                buffers = _added_buffers(owner)
                if buffers:
                    return f"the per-expert buffer self.{buffers[0]} is added to the scores before top-k"
    return None


def _group_findings(st: AnalyzerState, facts: dict[str, Any], rwhere: str) -> None:
    """moe.group_limit: none, or how a group is scored; group-limited
    routing whose group score is neither form is named as unsupported."""
    limited = facts.get("group_limited")
    if limited in ("sum_top2", "max"):
        st.add(known(limited, "moe.group_limit", CODE, f"{rwhere}: {facts['group_evidence']}"))
    elif limited:
        st.add(
            known(
                "group-limited routing",
                "unsupported.moe.group_limited_routing",
                CODE,
                f"{rwhere}: {facts['group_evidence']} (group score not classified)",
            )
        )
    else:
        evidence = facts.get("group_evidence") or "a plain top-k over the experts"
        st.add(known("none", "moe.group_limit", CODE, f"{rwhere}: {evidence}"))


def _group_routing(nodes: list[Any], topk: Node, experts: int | None) -> dict[str, Any]:
    """Group-limited routing (DeepSeek-V3's n_group / topk_group): a top-k
    over per-group scores that masks the experts before the final top-k.
    It changes nothing when every group is kept."""
    inner = [
        n
        for n in nodes
        if n is not topk
        and n.kind in ("call", "method")
        and n.name.rsplit(".", 1)[-1] == "topk"
        and depends_on(topk, n)
    ]
    if not inner:
        return {}
    groups = None
    for n in nodes:
        if (
            n.kind == "method"
            and n.name in ("view", "reshape")
            and len(n.args) == 4
            and all(isinstance(d, int) for d in n.args[1:])
            and n.args[1] == -1
        ):
            g, per = n.args[2], n.args[3]
            if experts is None or g * per == experts:
                groups = g
                break
    kept, form = None, None
    for n in inner:
        source = n.args[0] if n.args else None
        scored = _group_score(source)
        if scored is not None:
            form = scored
            k = n.args[1] if len(n.args) > 1 else n.kwarg("k")
            kept = k if isinstance(k, int) else None
    if groups is not None and kept is not None and (groups == 1 or kept >= groups):
        return {
            "group_limited": False,
            "group_evidence": f"{kept} of {groups} expert group(s) kept: no restriction",
        }
    detail = (
        f"experts restricted to the top {kept} of {groups} groups before the top-k"
        if groups is not None and kept is not None
        else "a top-k over expert groups masks the experts before the top-k"
    )
    if form is not None and groups is not None and kept is not None:
        scored = "the sum of its two best scores" if form == "sum_top2" else "its best score"
        return {"group_limited": form, "group_evidence": f"{detail}, a group scored by {scored}"}
    return {"group_limited": True, "group_evidence": detail}


def _group_score(source: Any) -> str | None:
    """How a group's score is computed from its experts' scores: the sum of
    the two best (``x.topk(2)[0].sum()``, DeepSeek-V3) or the best one
    (``x.max(dim=-1).values``, DeepSeek-V2); None when neither."""
    if not isinstance(source, Node):
        return None
    if source.kind == "method" and source.name == "sum" and source.args:
        item = source.args[0]
        if isinstance(item, Node) and item.kind == "item" and item.args:
            top = item.args[0]
            if isinstance(top, Node) and top.name.rsplit(".", 1)[-1] == "topk":
                k = top.args[1] if len(top.args) > 1 else top.kwarg("k")
                return "sum_top2" if k == 2 else None
        return None
    if source.kind == "attr" and source.name == "values" and source.args:
        inner = source.args[0]
        if isinstance(inner, Node) and inner.kind == "method" and inner.name in ("max", "amax"):
            return "max"
    if source.kind == "method" and source.name == "amax":
        return "max"
    return None


def _buffers(owner: Instance) -> list[str]:
    """Buffers of the owner's class: ``self.x = nn.Buffer(...)`` or
    ``self.register_buffer("x", ...)``."""
    node = getattr(owner.cls, "node", None)
    if not isinstance(node, ast.ClassDef):
        return []
    buffers: list[str] = []
    for stmt in ast.walk(node):
        if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Call):
            func = stmt.value.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name == "Buffer":
                buffers += [
                    t.attr
                    for t in stmt.targets
                    if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"
                ]
        elif (
            isinstance(stmt, ast.Call)
            and isinstance(stmt.func, ast.Attribute)
            and stmt.func.attr == "register_buffer"
            and stmt.args
            and isinstance(stmt.args[0], ast.Constant)
            and isinstance(stmt.args[0].value, str)
        ):
            buffers.append(stmt.args[0].value)
    return buffers


def _added_buffers(owner: Instance) -> list[str]:
    """Buffers of the owner's class that its methods add to a value
    (``... + self.x``): a per-expert routing bias held as a buffer, which the
    interpreter does not follow as a parameter."""
    node = getattr(owner.cls, "node", None)
    buffers = _buffers(owner)
    if not buffers or not isinstance(node, ast.ClassDef):
        return []
    added = []
    for expr in ast.walk(node):
        if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add):
            for side in map(uncast, (expr.left, expr.right)):
                if (
                    isinstance(side, ast.Attribute)
                    and isinstance(side.value, ast.Name)
                    and side.value.id == "self"
                    and side.attr in buffers
                    and side.attr not in added
                ):
                    added.append(side.attr)
    return added
