"""Static checkpoint keys for the routed experts of ``load_weights``.

The MoE references find a layer's router, experts, routing bias and shared
experts at load time among a fixed list of names
(``moe = moe_checkpoint_keys(names, prefix, n)``, ``f"{moe.router}.weight"``,
``moe.gate_up``, ``moe.down``, ``_routing_bias_key(...)``,
``_shared_expert_key(...)``, ``f"{moe.module}.shared_expert_gate.weight"``).
When research has read the checkpoint's own keys, these lookups become the
canonical keys (``{prefix}.mlp.gate.weight``, ...) for the key renames to
turn into the checkpoint's, and the lookup statement goes away.

The reference loads the experts in either layout, fused
(``<block>.experts.gate_up_proj``) or one tensor per expert
(``<block>.experts.<j>.gate_proj.weight``), chosen by the checkpoint's
names; so does the port: both layouts' canonical keys are written, chosen
at load time (``[fused] if fused in names else [per expert]``), and the
renames turn both into the checkpoint's the same way. When a rename
changes the name of an expert tensor itself (GraniteMoE's hub
``block_sparse_moe.input_linear.weight`` for ``mlp.experts.gate_up_proj``),
the other layout's names cannot be derived from the renames: the port loads
the planned layout only, refuses any other at load naming the key layout
(``_require_expert_layout``), and :func:`static_values` says which layout
is kept, for the port to declare no other.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst

from autoport_cst.transform.anatomy.mappings import MappingEntry, mapping_entries
from autoport_cst.transform.cst.snippets import parse_expr, parse_statement
from autoport_cst.transform.cst.vocabulary import code_of, simple_assign, string_value, walk
from autoport_cst.transform.edit.key_renames import KeyRenamer, expand, string_variables
from autoport_cst.transform.edit.tree import add_edit, followed_by

HELPER = "moe_checkpoint_keys"
ROUTING_BIAS_HELPER = "_routing_bias_key"
SHARED_HELPER = "_shared_expert_key"
LAYOUT_CHECK = "_require_expert_layout"

# the tail of each expert key under ``<block>.experts``, per layout ("{j}": the expert)
FUSED_TAILS = {"gate_up": ("gate_up_proj",), "down": ("down_proj",)}
PER_EXPERT_TAILS = {
    "gate_up": ("{j}.gate_proj.weight", "{j}.up_proj.weight"),
    "down": ("{j}.down_proj.weight",),
}
# the spec's checkpoint.gate_up value of each layout
GATE_UP = {"fused": "fused", "per_expert": "separate"}

LAYOUT_CHECK_CODE = '''
def _require_expert_layout(names, mappings, parameters: list[str], layout: str) -> None:
    """Refuse a checkpoint whose routed experts are not stored as this port
    loads them: its checkpoint key renames give the keys of one expert layout
    only (``layout``, the spec's checkpoint.gate_up: "fused" tensors or
    "separate" per-expert ones)."""
    missing = [key for parameter in parameters for key in mappings[parameter] if key not in names]
    if missing:
        expected = ", ".join(mappings[parameter][0] for parameter in parameters)
        raise KeyError(
            f"the checkpoint does not store the routed experts as this port loads them: "
            f"checkpoint.gate_up = {layout!r} ({expected}, ...), but it has no {missing[0]}; "
            "the port's checkpoint key renames give the keys of no other expert layout"
        )
'''


class LeftoverLookup(ValueError):
    """A use of a lookup's result that no static key replaces (``node``)."""

    def __init__(self, message: str, node: cst.CSTNode) -> None:
        super().__init__(message)
        self.node = node


@dataclass
class StaticKeys:
    """What :func:`static_values` found: the edits, and the expert layout the
    port is narrowed to (``""`` when it keeps both)."""

    edits: dict = field(default_factory=dict)
    only_layout: str = ""


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
    fn: cst.FunctionDef, module: cst.Module, per_expert: bool, renamer: KeyRenamer
) -> StaticKeys:
    """Edits turning the MoE lookups of ``fn`` into canonical keys, both
    expert layouts when ``renamer`` derives the other layout's names from the
    planned one's (``per_expert``), else the planned layout and a check that
    refuses any other."""
    found = StaticKeys()
    variables = string_variables(fn)[0]
    for stmt, var, call in lookup_statements(fn):
        prefix = _prefix_field(call)
        both = derives_other_layout(renamer, expand(f"{prefix}.mlp.experts", variables))
        planned = "per_expert" if per_expert else "fused"
        layouts = ("fused", "per_expert") if both else (planned,)
        lookup = _Lookup(
            var, prefix, _arg_code(call, 0, "names"), _arg_code(call, 2, "self.config.num_experts")
        )
        experts: list[MappingEntry] = []
        replaced: list[cst.BaseExpression] = []
        for entry in mapping_entries(fn):
            new = _static(entry.value, lookup, layouts, module)
            if new is None:
                continue
            replaced.append(entry.value)
            found.edits[id(entry.value)] = lambda updated, new=new: new
            if code_of(entry.value) in (f"{var}.gate_up", f"{var}.down"):
                experts.append(entry)
        _check_every_use_replaced(fn, stmt, var, replaced)
        found.edits[id(stmt)] = lambda updated: cst.RemoveFromParent()
        if not both and experts:
            found.only_layout = GATE_UP[planned]
            parameters = ", ".join(code_of(e.key_node) for e in experts)
            check = parse_statement(
                f'{LAYOUT_CHECK}({lookup.names}, mappings, [{parameters}], "{found.only_layout}")', module
            )
            add_edit(found.edits, id(experts[-1].statement), followed_by(check))
    return found


def _check_every_use_replaced(fn, stmt, var: str, replaced: list[cst.BaseExpression]) -> None:
    """The lookup statement goes: every use of its variable must be in a
    value replaced by a static key (else :class:`LeftoverLookup` names it)."""
    covered = {id(node) for node in walk(stmt)} | {id(n) for value in replaced for n in walk(value)}
    for node in walk(fn):
        if isinstance(node, cst.Name) and node.value == var and id(node) not in covered:
            raise LeftoverLookup(
                f"{var} = {HELPER}(...) is also used outside the mapping values this codemod turns into "
                f"static keys ({var} here): the lookup cannot go; map that use through mappings[...]",
                node,
            )


def derives_other_layout(renamer: KeyRenamer, block: str) -> bool:
    """Whether the renames give both layouts' expert keys under ``block``
    (``<prefix>.mlp.experts``, expanded) alike: no rename changes the name of
    an expert tensor itself, only the block's path."""
    moved = renamer.apply(block)
    tails = [t for kind in ("gate_up", "down") for t in FUSED_TAILS[kind] + PER_EXPERT_TAILS[kind]]
    return all(renamer.apply(f"{block}.{tail}") == f"{moved}.{tail}" for tail in tails)


@dataclass(frozen=True)
class _Lookup:
    var: str  # the lookup's variable (``moe``)
    prefix: str  # the layer prefix as an f-string field (``{prefix}``)
    names: str  # the code of the checkpoint's names (``names``)
    count: str  # the code of the number of experts


def _prefix_field(call: cst.Call) -> str:
    """The layer prefix argument as an f-string field (``{prefix}``)."""
    arg = call.args[1].value if len(call.args) > 1 else None
    if isinstance(arg, cst.Name):
        return "{" + arg.value + "}"
    raise ValueError(f"{HELPER}(...) takes its layer prefix as {code_of(arg) if arg else 'nothing'}")


def _arg_code(call: cst.Call, index: int, default: str) -> str:
    return code_of(call.args[index].value) if len(call.args) > index else default


def _static(value, lookup: _Lookup, layouts: tuple[str, ...], module) -> cst.BaseExpression | None:
    text, var, prefix = code_of(value), lookup.var, lookup.prefix
    router = f"{prefix}.mlp.gate"
    simple = {
        f'f"{{{var}.router}}.weight"': f"{router}.weight",
        f'f"{{{var}.router}}.bias"': f"{router}.bias",
        f'f"{{{var}.module}}.shared_expert_gate.weight"': f"{prefix}.mlp.shared_expert_gate.weight",
    }
    if text in simple:
        return parse_expr(f'f"{simple[text]}"', module)
    if text in (f"{var}.gate_up", f"{var}.down"):
        return parse_expr(_experts_code(lookup, text.rpartition(".")[2], layouts), module)
    if isinstance(value, cst.Call) and isinstance(value.func, cst.Name):
        args = [a.value for a in value.args]
        tensor = _string(args[-1]) if args else None
        if value.func.value == ROUTING_BIAS_HELPER and tensor:
            return parse_expr(f'f"{prefix}.mlp.gate.e_score_correction_bias"', module)
        if value.func.value == SHARED_HELPER and tensor:
            return parse_expr(f'f"{prefix}.mlp.shared_experts.{tensor}"', module)
    return None


def _experts_code(lookup: _Lookup, kind: str, layouts: tuple[str, ...]) -> str:
    """The keys of the ``kind`` ("gate_up" or "down") expert weights in each
    of ``layouts``: one layout's list, or the fused list when the checkpoint
    has the fused tensor and the per-expert lists otherwise."""
    block = f"{lookup.prefix}.mlp.experts"
    fused = f'f"{block}.{FUSED_TAILS[kind][0]}"'
    per_expert = " + ".join(
        f'[f"{block}.{tail}" for j in range({lookup.count})]' for tail in PER_EXPERT_TAILS[kind]
    )
    if layouts == ("fused",):
        return f"[{fused}]"
    if layouts == ("per_expert",):
        return per_expert
    return f"([{fused}] if {fused} in {lookup.names} else {per_expert})"


def _string(node: cst.BaseExpression) -> str | None:
    return string_value(node) if isinstance(node, cst.SimpleString) else None
