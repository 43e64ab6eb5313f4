"""The tensors a port of this model loads, by canonical name, and the key
of each in the checkpoint's header (``research.key_match``): the key map of
the spec, and the refusal when a tensor has no key.

Dense modules come from the code analysis's canonical module names; the
routed block of an MoE model adds its router (``mlp.gate``), the stacked
experts (``mlp.experts.gate_up_proj``, ``mlp.experts.down_proj``), the
routing bias (``mlp.gate.e_score_correction_bias``), the shared experts
(``mlp.shared_experts``) and their gate (``mlp.shared_expert_gate``), found
in the module tree by role and shape."""

from __future__ import annotations

from pathlib import Path

from autoport_cst.errors import InputError, Position
from autoport_cst.research.analysis.state import CodeAnalysis
from autoport_cst.research.key_match import (
    FUSED_DOWN,
    FUSED_GATE_UP,
    MOE_BLOCK,
    PER_EXPERT,
    ROUTER,
    ROUTING_BIAS,
    SHARED,
    SHARED_GATE,
    KeyMatch,
    Wanted,
    match_keys,
)
from autoport_cst.research.keys import TOP_LEVEL, rename


def dense_wanted(code: CodeAnalysis, names: dict[str, str], key_map: dict[str, str], skip_head: bool):
    """Wanted tensors of the canonical modules in ``names`` (weights and
    biases the code creates), layer modules in layer 0."""
    out: list[Wanted] = []
    for canonical in names:
        if canonical in ("model", "model.layers") or canonical in ("self_attn", "mlp"):
            continue
        if canonical == "lm_head" and skip_head:
            continue
        top = canonical in TOP_LEVEL
        full = canonical if top else f"model.layers.0.{canonical}"
        code_key = rename(full, key_map)
        for leaf in ("weight", "bias"):
            key = f"{code_key}.{leaf}"
            if key in code.expected:
                out.append(Wanted(canonical, leaf, key, _shape(code.expected[key]), None if top else 0))
    return out


def moe_names(code: CodeAnalysis, num_experts: int | None) -> tuple[int, dict[str, str]] | None:
    """(layer, canonical -> code path) of the routed block of the first MoE
    layer: the block, its router, experts, shared experts and their gate."""
    if not code.moe_layers:
        return None
    layer = code.moe_layers[0]
    at = f"model.layers.{layer}."
    blocks = [p for p, r in code.roles.items() if r == "moe" and p.startswith(at) and "." not in p[len(at) :]]
    if len(blocks) != 1:
        return None
    block = blocks[0]
    names = {MOE_BLOCK: block[len(at) :]}
    routers = [r for r in code.router_modules if r.startswith(block + ".")]
    if not routers:
        routers = [
            r.replace(r[: r.index(".", len("model.layers.")) + 1], at, 1)
            for r in code.router_modules
            if r.startswith("model.layers.")
        ]
    if len(routers) == 1:
        names[ROUTER] = _router_projection(code, routers[0])[len(at) :]
    for path, role in code.roles.items():
        rest = path[len(block) + 1 :] if path.startswith(block + ".") else None
        if rest is None or "." in rest:
            continue
        if role == "experts":
            names["mlp.experts"] = path[len(at) :]
        elif role == "mlp":
            names[SHARED] = path[len(at) :]
        elif role == "linear" and _shape(code.expected.get(f"{path}.weight"))[:1] == (1,):
            names[SHARED_GATE] = path[len(at) :]
    return layer, names


def _router_projection(code: CodeAnalysis, router: str) -> str:
    """The module holding the router's weight: the router itself, or its one
    projection child (Hunyuan's ``gate.wg``)."""
    if f"{router}.weight" in code.expected:
        return router
    children = [
        k[: -len(".weight")]
        for k, shape in code.expected.items()
        if k.startswith(router + ".") and k.endswith(".weight") and len(_shape(shape)) == 2
    ]
    return children[0] if len(children) == 1 else router


def moe_wanted(code: CodeAnalysis, layer: int, names: dict[str, str], routing_bias: bool, experts: int):
    """Wanted tensors of the routed block (layer ``layer``)."""
    at = f"model.layers.{layer}"
    out: list[Wanted] = []

    def add(canonical: str, leaf: str, code_path: str, **extra) -> None:
        key = f"{at}.{code_path}.{leaf}" if leaf else f"{at}.{code_path}"
        if key in code.expected:
            out.append(Wanted(canonical, leaf, key, _shape(code.expected[key]), layer, **extra))

    if ROUTER in names:
        add(ROUTER, "weight", names[ROUTER])
        add(ROUTER, "bias", names[ROUTER])
    if "mlp.experts" in names:
        stacked = sorted(
            (k, _shape(s))
            for k, s in code.expected.items()
            if k.startswith(f"{at}.{names['mlp.experts']}.") and len(_shape(s)) == 3
        )
        for canonical, (key, shape) in zip((FUSED_DOWN, FUSED_GATE_UP), _by_width(stacked), strict=False):
            out.append(Wanted(canonical, "", key, shape, layer))
    if SHARED in names:
        for role in PER_EXPERT:
            add(f"{SHARED}.{role}", "weight", f"{names[SHARED]}.{role}")
    if SHARED_GATE in names:
        add(SHARED_GATE, "weight", names[SHARED_GATE])
    if routing_bias:
        out.append(_routing_bias(code, at, names, layer, experts))
    return out


def _by_width(stacked: list[tuple[str, tuple[int, ...]]]) -> list[tuple[str, tuple[int, ...]]]:
    """The stacked down then gate/up tensors: gate/up is the wider one
    (2 x the expert width)."""
    if len(stacked) != 2:
        return []
    return sorted(stacked, key=lambda item: max(item[1][1:]))


def _routing_bias(code: CodeAnalysis, at: str, names: dict[str, str], layer: int, experts: int) -> Wanted:
    """The per-expert routing bias: a parameter of the block shaped [E] or
    [1, E] other than the router's bias (a buffer is not in the module
    tree's parameters: then only its shape is known)."""
    block = f"{at}.{names[MOE_BLOCK]}."
    router_bias = f"{at}.{names[ROUTER]}.bias" if ROUTER in names else None
    found = [
        k
        for k, s in code.expected.items()
        if k.startswith(block) and k != router_bias and _shape(s) in ((experts,), (1, experts))
    ]
    key = (
        found[0] if len(found) == 1 else f"{at}.{names.get(ROUTER, names[MOE_BLOCK])}.e_score_correction_bias"
    )
    return Wanted(ROUTING_BIAS, "", key, (experts,), layer, alternatives=((1, experts),))


def refuse_missing(match: KeyMatch, directory: str, files: tuple[str, ...], architecture: str) -> None:
    """Exit 2 naming the first tensor the port loads that the checkpoint has
    no key for, and the keys it does have there."""
    if not match.missing:
        return
    item, near = match.missing[0]
    others = [w.code_key for w, _ in match.missing[1:4]]
    where = Path(directory) / files[0] if files else Path(directory)
    message = (
        f"{architecture}: the checkpoint has no tensor for {item.canonical}"
        + (f".{item.leaf}" if item.leaf else "")
        + f" (transformers' {item.code_key}, shape {item.shape}), which a port loads; "
        + ("no stored tensor of that layer has its shape and place" if near else "nothing is stored there")
        + ("; keys present: " + ", ".join(near) if near else "")
        + (f"; also missing: {', '.join(others)}" if others else "")
    )
    raise InputError(message, Position(str(where)))


def _shape(shape) -> tuple[int, ...]:
    return tuple(shape) if shape is not None else ()


__all__ = ["FUSED_GATE_UP", "dense_wanted", "match_keys", "moe_names", "moe_wanted", "refuse_missing"]
