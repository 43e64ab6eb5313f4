"""Where a vision tower's weights and sizes are written: the checkpoint names
of its MLP projections and merger parts (``vision.module_names``, read from
the modules transformers builds) and the ``vision_config`` keys holding the
tower's widths when the config writes them under other names than the port
reads (``vision.config_keys``: Qwen2-VL's ``embed_dim`` is the tower width,
its ``hidden_size`` the merged width)."""

from __future__ import annotations

from typing import Any

from torch import nn

from autoport_cst.research import vision_tower as vt
from autoport_cst.research.findings import CODE, CONFIG, Finding, known, unknown

# the port's tower fields, each read from vision_config under its own name unless config_keys says
PORT_FIELDS = ("hidden_size", "out_hidden_size", "intermediate_size")


def block_mlp_names(mlp_name: str, mlp: nn.Module, readers: list[str]) -> dict[str, str] | None:
    """A plain MLP's up projection (it reads the block input) and down
    projection (the other); a gated one's gate (:func:`gate_of`), up and
    down; named under the block. None when the projections do not say."""
    names = [n for n, _ in vt.linears(mlp)]
    rest = [n for n in names if n not in readers]
    if len(rest) != 1 or len(readers) not in (1, 2):
        return None
    found = {"mlp_up": readers[0], "mlp_down": rest[0]}
    if len(readers) == 2:
        gate = gate_of(mlp, readers)
        if gate is None:
            return None
        found.update(mlp_gate=gate, mlp_up=next(n for n in readers if n != gate))
    return {role: f"{mlp_name}.{name}" for role, name in found.items()}


def gate_of(mlp: nn.Module, readers: list[str]) -> str | None:
    """The gate of a gated MLP, by what it computes: of the two projections
    reading the input, the one that silences the MLP when it outputs -20
    everywhere (act(-20) is about 0 for SiLU and GELU), with unit weights and
    zero biases elsewhere; the up projection's -20 only scales the output."""
    import torch

    silenced = []
    for name in readers:
        probe = vt.on_cpu(mlp)
        linear = getattr(probe, name)
        if linear.bias is None:
            return None
        with torch.no_grad():
            linear.weight.zero_()
            linear.bias.fill_(-20.0)
            out = probe(torch.ones(1, linear.in_features))
        silenced.append(bool(out.abs().max() < 1e-2))
    return readers[silenced.index(True)] if silenced.count(True) == 1 else None


def merger_names(name: str, merger: nn.Module, norm: str | None) -> dict[str, str] | None:
    """The merger's norm and its first and last projections, named under the tower."""
    found = [n for n, m in merger.named_modules() if isinstance(m, nn.Linear)]
    if norm is None or len(found) != 2:
        return None
    return {
        "merger_norm": f"{name}.{norm}",
        "merger_fc1": f"{name}.{found[0]}",
        "merger_fc2": f"{name}.{found[1]}",
    }


def module_names_finding(names: dict[str, str]) -> Finding:
    roles: tuple[str, ...] = ("mlp_up", "mlp_down", "merger_norm", "merger_fc1", "merger_fc2")
    roles = (*roles, "mlp_gate") if "mlp_gate" in names else roles
    if all(role in names for role in roles):
        evidence = ", ".join(f"{role} {names[role]}" for role in roles)
        return known(dict(names), "vision.module_names", CODE, evidence)
    missing = [role for role in roles if role not in names]
    return unknown("vision.module_names", CODE, f"not found in the modules: {', '.join(missing)}")


def config_keys(raw: dict[str, Any], values: dict[str, Any]) -> tuple[dict[str, str] | None, Finding]:
    """The ``vision_config`` key (or product of two keys) holding each port
    field's value as the modules show it; None when every field is under its
    own name. A value no key (or two) holds, or several keys hold, is unknown.
    A port field's own key is a candidate for another field once that field
    is read elsewhere (Qwen2-VL's hidden_size is its merged width); an
    intermediate size may be the width times a ``*_ratio`` key (mlp_ratio)."""
    found: dict[str, str] = {}
    for name in PORT_FIELDS:
        value = values.get(name)
        if value is None or raw.get(name) == value:
            continue
        taken = {n for n in PORT_FIELDS if n not in found} | set(found.values())
        keys = [k for k, v in raw.items() if k not in taken and _is_number(v) and v == value]
        if not keys and name == "intermediate_size" and "hidden_size" in found:
            width = found["hidden_size"]
            ratios = [k for k, v in raw.items() if k.endswith("_ratio") and _is_number(v)]
            keys = [f"{width} * {k}" for k in ratios if raw[k] * raw[width] == value]
        if len(keys) != 1:
            why = f"{len(keys)} keys hold" if keys else "no key holds"
            return None, unknown("vision.config_keys", CONFIG, f"vision_config: {why} {name} = {value}")
        found[name] = keys[0]
    evidence = ", ".join(f"{k} <- {v}" for k, v in found.items()) or "every tower field under its own name"
    return (found or None), known(found or None, "vision.config_keys", CONFIG, f"vision_config: {evidence}")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
