"""The MLP section: what a feed-forward module computes, by its
arithmetic: an activation output multiplied by a second projection (gated)
or not (plain), the activation (``ACT2FN[config.<key>]``, a torch function)
or the clamped SwiGLU of GPT-OSS, biases, gate and up fused in one
projection (split, or interleaved columns), the intermediate width, and the
canonical projection names. The MoE section classifies experts with the
same :func:`mlp_facts`."""

from __future__ import annotations

from typing import Any

from autoport_cst.research.activation_values import activation_by_values
from autoport_cst.research.analysis.graph import (
    has_step2,
    is_one,
    number,
    param_inside,
    torch_activation,
    unique,
)
from autoport_cst.research.analysis.state import AnalyzerState
from autoport_cst.research.analysis.width_source import width_fields
from autoport_cst.research.findings import CODE, known, unknown
from autoport_cst.research.interp.values import Instance, Node, SourceClass
from autoport_cst.research.interp.walk import depends_on, walk

# transformers activation names -> spec activation (a property of the
# activation functions, not of any model)
ACTIVATIONS = {
    "silu": "silu",
    "swish": "silu",
    "gelu": "gelu",
    "gelu_python": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
    "gelu_accurate": "gelu_tanh",
    "relu": "relu",
    "relu2": "relu2",
    "quick_gelu": "quick_gelu",
    "xielu": "xielu",  # learned parameters (alpha_p, alpha_n, beta, eps) in the activation module
}


def analyze(st: AnalyzerState, mlp: Instance, prefix: str, field_prefix: str) -> None:
    """Classify the dense MLP ``mlp`` (state-dict prefix ``prefix``): its
    findings, projection module paths and canonical names."""
    where = st.where(mlp)
    facts = mlp_facts(st, mlp)
    st.result.mlp_modules = [prefix + (name or "?") for name, _, _ in facts.get("linears", [])]
    if field_prefix == "mlp":
        ffn = prefix[len(st.layer_prefix) :].split(".", 1)[1].rstrip(".")  # "<index>.mlp." -> "mlp"
        st.result.module_names["mlp"] = ffn
        for role, name in facts.get("roles", {}).items():
            st.result.module_names[f"mlp.{role}"] = f"{ffn}.{name}" if ffn else name  # in the layer
        st.result.linear_modules += [
            st.base_module(c) or "?" for _, c in mlp.children() if st.role(c) == "linear"
        ]
    mlp_findings(st, facts, where, field_prefix)
    inner_norm(st, mlp, where)
    if facts["intermediate"] is not None:
        fields = width_fields(mlp)
        derived = (
            f"; {mlp.class_name}.__init__ computes it from config {', '.join(fields)}"
            if fields and fields != ("intermediate_size",)
            else ""
        )
        st.add(
            known(
                facts["intermediate"],
                "mlp.intermediate_size",
                CODE,
                f"{where}: projection width {facts['intermediate']}{derived}",
            )
        )


def inner_norm(st: AnalyzerState, inst: Instance, where: str) -> None:
    """A norm between the MLP's projections (BitNet's ``ffn_sub_norm`` on
    ``act(gate) * up`` before ``down_proj``): no spec field holds it."""
    for value in st.outputs(inst)[:1]:
        nodes = list(walk(value))
        linear = [n for n in nodes if n.kind == "module" and n.ref is not None and st.role(n.ref) == "linear"]
        for n in nodes:
            if not (n.kind == "module" and n.ref is not None and st.role(n.ref) == "norm" and n.args):
                continue
            reads = any(depends_on(n.args[0], p) for p in linear)
            read_by = [p for p in linear if p.args and depends_on(p.args[0], n)]
            if reads and read_by:
                st.add(
                    known(
                        True,
                        "code.mlp_inner_norm",
                        CODE,
                        f"{where}: {n.ref.name} normalises the projections' product before "
                        f"{read_by[0].ref.name}",
                    )
                )
                return


def mlp_facts(st: AnalyzerState, inst: Instance) -> dict[str, Any]:
    """What the MLP-like module ``inst`` (an MLP, an expert, stacked
    experts) computes: kind (gated or plain), activation and its config key,
    the clamped SwiGLU (``glu``), bias, fused or interleaved gate/up, the
    intermediate width, its projections and their canonical roles."""
    facts: dict[str, Any] = {
        "kind": None,
        "act": None,
        "act_key": None,
        "bias": None,
        "fused": None,
        "intermediate": None,
        "evidence": "",
        "interleaved_gate_up": False,
    }
    outs = st.outputs(inst)
    if not outs:
        facts["evidence"] = "forward could not be followed"
        return facts
    nodes = list(walk(outs[0]))
    acts = [n for n in nodes if n.kind == "act" or torch_activation(n)]
    linear_calls, lin_insts, param_mm = _projections(st, inst, nodes)
    _activation(facts, nodes, acts)
    modules = [
        n for n in nodes if n.kind == "module" and n.ref is not None and st.role(n.ref) == "activation"
    ]
    if modules and not acts and facts["act"] is None:
        _activation_by_values(st, facts, modules[0].ref)
    gated = _gated(nodes, linear_calls + param_mm)
    if acts or modules or gated:
        facts["kind"] = "gated" if gated else "plain"
    chunks = [
        n
        for n in nodes
        if n.kind == "method"
        and n.name in ("chunk", "split")
        or (n.kind == "call" and n.name.rsplit(".", 1)[-1] in ("chunk", "split"))
    ]
    step2 = [
        n
        for n in nodes
        if n.kind == "item" and isinstance(n.args[1], (slice, tuple)) and has_step2(n.args[1])
    ]
    fused = bool(gated and (chunks or step2) and len(unique([p.ref for p in linear_calls])) <= 2)
    if param_mm and gated and (chunks or step2):
        fused = True
    facts["fused"] = fused
    facts["interleaved_gate_up"] = bool(gated and step2)
    facts["bias"] = _bias(inst, lin_insts, param_mm)
    up = [
        i
        for i in lin_insts
        if isinstance(i.args.get("out_features"), int)
        and i.args.get("out_features") != st.dims.get("hidden_size")
    ]
    if up:
        width = up[0].args["out_features"]
        facts["intermediate"] = width // 2 if fused else width
    facts["linears"] = [(i.name, i.args.get("out_features"), i.args.get("bias")) for i in lin_insts]
    facts["roles"] = _roles(linear_calls, acts, gated, fused)
    return facts


def _activation_by_values(st: AnalyzerState, facts: dict[str, Any], module: Instance) -> None:
    """An activation module written out (BLOOM's ``BloomGelu``): named when
    its values are those of one of transformers' activations."""
    where = st.where(module)
    cls = module.cls
    found = activation_by_values(cls.module.dotted, cls.name) if isinstance(cls, SourceClass) else None
    if found is None:
        facts["evidence"] = f"activation computed by {where}, not a function research names"
        return
    facts["act"], facts["by_values"] = found[0], True
    facts["evidence"] = (
        f"activation computed by {where}: its values on [-20, 20] are transformers' {found[0]!r} "
        f"(largest relative difference {found[1]:.1e})"
    )


def _projections(
    st: AnalyzerState, inst: Instance, nodes: list[Node]
) -> tuple[list[Node], list[Instance], list[Node]]:
    """The MLP's projections: the calls of its linear submodules, those
    submodules in the order ``__init__`` set them, and the products with
    parameters (``matmul``/``bmm``/``F.linear`` of stacked weights)."""
    linear_calls = [
        n for n in nodes if n.kind == "module" and n.ref is not None and st.role(n.ref) == "linear"
    ]
    order = list(inst.attrs)
    lin_insts = sorted(
        unique([c.ref for c in linear_calls]), key=lambda i: order.index(i.name) if i.name in order else 99
    )
    param_mm = [
        n
        for n in nodes
        if n.kind in ("binop", "call")
        and (n.name.rsplit(".", 1)[-1] in ("matmul", "bmm") or n.name.endswith(".linear"))
        and any(param_inside(x) for x in n.args)
    ]
    return linear_calls, lin_insts, param_mm


def _activation(facts: dict[str, Any], nodes: list[Node], acts: list[Node]) -> None:
    """The activation (``ACT2FN[...]`` or a torch function) and its config
    key; with none, the clamped SwiGLU's gate function if that is what the
    arithmetic computes."""
    if acts:
        act = acts[0]
        if act.kind == "act":
            facts["act"] = act.ref.name
            facts["act_key"] = act.ref.key
        else:
            facts["act"] = torch_activation(act)
    else:
        sig = [n for n in nodes if n.kind == "call" and n.name.rsplit(".", 1)[-1] == "sigmoid"]
        facts["evidence"] = (
            "custom activation (x * sigmoid(alpha * x)-like)" if sig else "no activation function found"
        )
        clamped = _clamped_swiglu(nodes)
        if clamped is not None:
            facts["act"], facts["glu"], facts["evidence"] = "silu", clamped, clamped["evidence"]


def _activated(value: Any) -> bool:
    return any(
        m.kind == "act" or torch_activation(m) or (m.kind == "call" and m.name.endswith("sigmoid"))
        for m in walk(value)
    )


def _gated(nodes: list[Node], projections: list[Node]) -> bool:
    """An activation output multiplied by another projection's output."""
    for n in nodes:
        if n.kind == "binop" and n.name == "mul":
            x, y = n.args
            ax = _activated(x)
            ay = _activated(y)
            if ax != ay:
                other = y if ax else x
                act_side = x if ax else y
                if (
                    any(depends_on(other, p) for p in projections)
                    and not number(other)
                    and any(depends_on(act_side, p) for p in projections)
                ):
                    return True
    return False


def _bias(inst: Instance, lin_insts: list[Instance], param_mm: list[Node]) -> bool | None:
    """The projections' bias: their evaluated ``bias`` argument, or for
    parameters multiplied directly, a bias parameter."""
    biases = [i.args.get("bias") for i in lin_insts]
    param_biases = [name for name, p in inst.params() if "bias" in name]
    if lin_insts and all(b in (True, False) for b in biases):
        return any(biases) if len(set(biases)) == 1 else None
    if param_mm:
        return bool(param_biases)
    return None


def _roles(calls: list[Node], acts: list[Node], gated: bool, fused: bool) -> dict[str, str]:
    """Canonical MLP projection names (gate_proj, up_proj, down_proj,
    gate_up_proj) -> the attribute names the code uses."""
    outputs = [
        c for c in calls if any(depends_on(c.args[0] if c.args else None, o) for o in calls if o is not c)
    ]
    inputs = [c for c in calls if not any(c is o for o in outputs)]
    out_insts = unique([c.ref for c in outputs])
    in_insts = unique([c.ref for c in inputs])
    roles: dict[str, str] = {}
    if len(out_insts) == 1 and out_insts[0].name:
        roles["down_proj"] = out_insts[0].name
    if len(in_insts) == 1 and in_insts[0].name:
        roles["gate_up_proj" if fused else "up_proj"] = in_insts[0].name
    elif len(in_insts) == 2 and gated:
        activated = [
            i for i in in_insts if any(depends_on(act, c) for act in acts for c in inputs if c.ref is i)
        ]
        if len(activated) == 1:
            gate = activated[0]
            up = in_insts[1] if in_insts[0] is gate else in_insts[0]
            if gate.name and up.name:
                roles["gate_proj"], roles["up_proj"] = gate.name, up.name
    return roles


def mlp_findings(st: AnalyzerState, facts: dict[str, Any], where: str, field_prefix: str) -> None:
    """The findings of :func:`mlp_facts` under ``field_prefix`` (kind,
    activation, glu, bias, fused gate/up)."""
    _kind_finding(st, facts, where, field_prefix)
    _activation_findings(st, facts, where, field_prefix)
    _glu_findings(st, facts, where, field_prefix)
    _projection_findings(st, facts, where, field_prefix)


def _kind_finding(st: AnalyzerState, facts: dict[str, Any], where: str, field_prefix: str) -> None:
    """Gated (an activation output times a second projection) or plain."""
    if facts["kind"] is None:
        st.add(unknown(f"{field_prefix}.kind", CODE, f"{where}: {facts['evidence'] or 'not classified'}"))
    else:
        detail = (
            "activation output multiplied by a second projection"
            if facts["kind"] == "gated"
            else "activation applied to one projection, no product"
        )
        st.add(known(facts["kind"], f"{field_prefix}.kind", CODE, f"{where}: {detail}"))


def _activation_findings(st: AnalyzerState, facts: dict[str, Any], where: str, field_prefix: str) -> None:
    """The activation (the clamped SwiGLU's is silu) and the config key it is read from."""
    act = facts["act"]
    glu = facts.get("glu")
    if act is None:
        st.add(
            unknown(f"{field_prefix}.activation", CODE, f"{where}: {facts['evidence'] or 'no activation'}")
        )
    elif glu is not None:
        st.add(known("silu", f"{field_prefix}.activation", CODE, f"{where}: {glu['evidence']}"))
    elif act not in ACTIVATIONS:
        st.add(unknown(f"{field_prefix}.activation", CODE, f"{where}: activation {act!r} has no spec value"))
    else:
        key = f" (config.{facts['act_key']} = {act!r})" if facts["act_key"] else f" ({act})"
        text = facts["evidence"] if facts.get("by_values") else f"ACT2FN{key}"
        st.add(known(ACTIVATIONS[act], f"{field_prefix}.activation", CODE, f"{where}: {text}"))
    if facts["act_key"]:
        st.add(
            known(
                facts["act_key"],
                "code.activation_key",
                CODE,
                f"{where}: activation read from config.{facts['act_key']}",
            )
        )


def _glu_findings(st: AnalyzerState, facts: dict[str, Any], where: str, field_prefix: str) -> None:
    """The gated unit's form: the clamped SwiGLU with its gain and bound, or the standard one."""
    glu = facts.get("glu")
    if glu is not None:
        st.add(known("clamped_swiglu", f"{field_prefix}.glu", CODE, f"{where}: {glu['evidence']}"))
        st.add(
            known(glu["alpha"], f"{field_prefix}.glu_alpha", CODE, f"{where}: sigmoid gain {glu['alpha']}")
        )
        st.add(known(glu["limit"], f"{field_prefix}.glu_limit", CODE, f"{where}: clamp bound {glu['limit']}"))
    elif facts["kind"] == "gated":
        st.add(known("standard", f"{field_prefix}.glu", CODE, f"{where}: act(gate) * up"))


def _projection_findings(st: AnalyzerState, facts: dict[str, Any], where: str, field_prefix: str) -> None:
    """The projections' bias, and gate and up fused (interleaved) in one projection."""
    if facts["bias"] is None:
        st.add(unknown(f"{field_prefix}.bias", CODE, f"{where}: projection biases not determined"))
    else:
        st.add(
            known(
                facts["bias"],
                f"{field_prefix}.bias",
                CODE,
                f"{where}: "
                + (
                    ", ".join(f"{n}(bias={b})" for n, _, b in facts.get("linears", []))
                    or ("bias parameters" if facts["bias"] else "no bias parameters")
                ),
            )
        )
    st.add(
        known(
            bool(facts["fused"]),
            "code.fused_gate_up",
            CODE,
            f"{where}: "
            + (
                "gate and up come from one projection, split in forward"
                if facts["fused"]
                else "separate gate and up projections or no gate"
            ),
        )
    )
    if facts["interleaved_gate_up"]:
        st.add(
            known(
                True,
                "code.interleaved_gate_up",
                CODE,
                f"{where}: gate and up are the even and odd columns of the fused projection",
            )
        )


def _clamp_bounds(value: Any) -> tuple[Any, Any, Any] | None:
    """``x.clamp(min, max)`` / ``torch.clamp(x, min, max)`` -> (x, min, max)."""
    if (
        not isinstance(value, Node)
        or value.kind not in ("method", "call")
        or value.name.rsplit(".", 1)[-1] not in ("clamp", "clamp_", "clip", "clip_")
        or not value.args
    ):
        return None
    rest = list(value.args[1:]) + [None, None]
    return value.args[0], value.kwarg("min", rest[0]), value.kwarg("max", rest[1])


def _gain_sigmoid(value: Any) -> tuple[Any, float] | None:
    """``g * sigmoid(alpha * g)`` (either operand order) -> (g, alpha)."""
    if not (
        isinstance(value, Node) and value.kind == "binop" and value.name == "mul" and len(value.args) == 2
    ):
        return None
    for g, sig in (value.args, value.args[::-1]):
        if not (
            isinstance(sig, Node)
            and sig.kind in ("call", "method")
            and sig.args
            and sig.name.rsplit(".", 1)[-1] == "sigmoid"
        ):
            continue
        inner = sig.args[0]
        if isinstance(inner, Node) and inner.kind == "binop" and inner.name == "mul" and len(inner.args) == 2:
            for x, alpha in (inner.args, inner.args[::-1]):
                if number(alpha) and not isinstance(alpha, bool) and (x is g or x == g):
                    return g, float(alpha)
    return None


def _clamped_swiglu(nodes: list[Node]) -> dict[str, Any] | None:
    """The clamped SwiGLU of GPT-OSS, by its arithmetic: ``g = clamp(gate,
    max=L)``, ``u = clamp(up, -L, L)``, ``g * sigmoid(alpha g) * (u + 1)``.
    Any other bound, offset or gate function is not this computation."""
    for node in nodes:
        if not (node.kind == "binop" and node.name == "mul" and len(node.args) == 2):
            continue
        for glu, shifted in (node.args, node.args[::-1]):
            gated = _gain_sigmoid(glu)
            if gated is None or not (
                isinstance(shifted, Node)
                and shifted.kind == "binop"
                and shifted.name == "add"
                and len(shifted.args) == 2
            ):
                continue
            up = next((x for x, one in (shifted.args, shifted.args[::-1]) if is_one(one)), None)
            gate_bounds, up_bounds = _clamp_bounds(gated[0]), _clamp_bounds(up)
            if gate_bounds is None or up_bounds is None:
                continue
            limit = gate_bounds[2]
            if (
                gate_bounds[1] is None
                and number(limit)
                and up_bounds[2] == limit
                and number(up_bounds[1])
                and up_bounds[1] == -limit
            ):
                return {
                    "alpha": gated[1],
                    "limit": float(limit),
                    "evidence": f"clamped SwiGLU: g = gate.clamp(max={limit}), u = up.clamp({-limit}, {limit}), "
                    f"g * sigmoid({gated[1]} * g) * (u + 1)",
                }
    return None
