"""Static checkpoint keys for the routed experts of ``load_weights``.

The MoE references find a layer's router, experts, routing bias and shared
experts at load time among a fixed list of names
(``moe = moe_checkpoint_keys(names, prefix, n)``, ``f"{moe.router}.weight"``,
``moe.gate_up``, ``moe.down``, ``_routing_bias_key(...)``,
``_shared_expert_key(...)``, ``f"{moe.module}.shared_expert_gate.weight"``).
When research has read the checkpoint's own keys, these lookups become the
canonical keys (``{prefix}.mlp.gate.weight``, ...) for the key renames to
turn into the checkpoint's, and the lookup statement goes away.
"""

from __future__ import annotations

from collections.abc import Callable

import libcst as cst

from autoport_cst.transform.anatomy.mappings import mapping_entries
from autoport_cst.transform.cst.snippets import parse_expr
from autoport_cst.transform.cst.vocabulary import code_of, simple_assign, string_value, walk

HELPER = "moe_checkpoint_keys"
ROUTING_BIAS_HELPER = "_routing_bias_key"
SHARED_HELPER = "_shared_expert_key"


def lookup_statements(fn: cst.FunctionDef) -> list[tuple[cst.SimpleStatementLine, str, cst.Call]]:
    """``<var> = moe_checkpoint_keys(...)`` statements: (statement, variable, call)."""
    out = []
    for stmt in walk(fn):
        if not isinstance(stmt, cst.SimpleStatementLine):
            continue
        pair = simple_assign(stmt)
        if pair is None or not isinstance(pair[0], cst.Name) or not isinstance(pair[1], cst.Call):
            continue
        func = pair[1].func
        if isinstance(func, cst.Name) and func.value == HELPER:
            out.append((stmt, pair[0].value, pair[1]))
    return out


def static_values(
    fn: cst.FunctionDef, module: cst.Module, per_expert: bool, rename: Callable[[str], str]
) -> tuple[dict, list[str]]:
    """Edits turning the MoE lookups of ``fn`` into canonical keys (per-expert
    lists already renamed by ``rename``), and the canonical keys written."""
    lookups = lookup_statements(fn)
    if not lookups:
        return {}, []
    edits: dict = {}
    written: list[str] = []
    for stmt, var, call in lookups:
        prefix = _prefix_field(call, module)
        count = code_of(call.args[2].value) if len(call.args) > 2 else "self.config.num_experts"
        canonical = {
            f"{var}.router": f"{prefix}.mlp.gate",
            f"{var}.module": f"{prefix}.mlp",
        }
        for entry in mapping_entries(fn):
            new = _static(entry.value, var, canonical, per_expert, count, rename, module)
            if new is None:
                continue
            written.append(code_of(new))
            edits[id(entry.value)] = lambda updated, new=new: new
        edits[id(stmt)] = lambda updated: cst.RemoveFromParent()
    return edits, written


def _prefix_field(call: cst.Call, module: cst.Module) -> str:
    """The layer prefix argument as an f-string field (``{prefix}``)."""
    arg = call.args[1].value if len(call.args) > 1 else None
    if isinstance(arg, cst.Name):
        return "{" + arg.value + "}"
    raise ValueError(f"{HELPER}(...) takes its layer prefix as {code_of(arg) if arg else 'nothing'}")


def _static(value, var, canonical, per_expert, count, rename, module) -> cst.BaseExpression | None:
    text = code_of(value)
    prefix = canonical[f"{var}.router"][: -len(".mlp.gate")]
    simple = {
        f'f"{{{var}.router}}.weight"': f"{canonical[f'{var}.router']}.weight",
        f'f"{{{var}.router}}.bias"': f"{canonical[f'{var}.router']}.bias",
        f'f"{{{var}.module}}.shared_expert_gate.weight"': f"{prefix}.mlp.shared_expert_gate.weight",
    }
    if text in simple:
        return parse_expr(f'f"{simple[text]}"', module)
    if text in (f"{var}.gate_up", f"{var}.down"):
        roles = ("gate_proj", "up_proj") if text.endswith("gate_up") else ("down_proj",)
        if not per_expert:
            fused = "gate_up_proj" if text.endswith("gate_up") else "down_proj"
            return parse_expr(f'[f"{prefix}.mlp.experts.{fused}"]', module)
        parts = [
            f'[f"{rename(f"{prefix}.mlp.experts.*.{role}.weight").replace(".*.", ".{j}.")}" for j in range({count})]'
            for role in roles
        ]
        return parse_expr(" + ".join(parts), module)
    if isinstance(value, cst.Call) and isinstance(value.func, cst.Name):
        args = [a.value for a in value.args]
        tensor = _string(args[-1]) if args else None
        if value.func.value == ROUTING_BIAS_HELPER and tensor:
            return parse_expr(f'f"{prefix}.mlp.gate.e_score_correction_bias"', module)
        if value.func.value == SHARED_HELPER and tensor:
            return parse_expr(f'f"{prefix}.mlp.shared_experts.{tensor}"', module)
    return None


def _string(node: cst.BaseExpression) -> str | None:
    return string_value(node) if isinstance(node, cst.SimpleString) else None
