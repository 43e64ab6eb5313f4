"""The pre-MLP norm of the MoE references, which lives in the experts class
(next to the router, so that the decode kernel can fuse it), for the
codemods that move a decoder layer's norms (``norm-placement``) or feed
the MLP the layer input (``parallel-residual``), and the fused decode kernel
that RMS-normalizes the experts' input (``swap-norm``)."""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from autoport_cst.transform.anatomy.classes import self_assignments
from autoport_cst.transform.anatomy.decoder import layer_methods, norm_attrs
from autoport_cst.transform.cst.roles import class_role
from autoport_cst.transform.cst.vocabulary import (
    classes_with_role,
    deep_statements,
    dotted,
    nodes_of,
    self_assignment,
    self_attr,
    walk,
)
from autoport_cst.transform.edit.mappings import (
    has_segment,
    map_value_strings,
    mapping_entries_of_attr,
    replace_segment,
)
from autoport_cst.transform.edit.tree import add_edit

# the flag of an experts class whose decode runs one kernel fusing its input norm (``NF.moe_block_tkg``)
FUSED_FLAG = "fused_decode"


@dataclass(frozen=True)
class ExpertsNorm:
    """The norm an experts class applies to its input: in the MoE
    references the decoder layer's pre-MLP norm lives there, next to the
    router, so that the decode kernel can fuse it."""

    cls: cst.ClassDef
    attr: str
    assignment: cst.SimpleStatementLine


def experts_norms(layer, module: cst.Module, ctx) -> list[ExpertsNorm]:
    """The norms of the experts classes when the layer is pre-norm but for
    its MLP calls, which no norm statement surrounds because the experts
    apply their own (the MoE references); [] for another layer. A dense MLP
    class the layer builds on some layers instead of the experts
    (``dense-layers``) holds the same norm, like the experts: it is one of
    them."""
    if moe_placement(layer) != "pre":
        return []
    built = layer_mlp_classes(layer)
    found = []
    for cls in classes_with_role(module, "experts") + classes_with_role(module, "mlp"):
        norms = [n for n in norm_attrs(cls) if self_assignments(cls).get(n)]
        if not norms:
            continue
        if (class_role_of(cls) == "mlp" and cls.name.value not in built) or len(norms) > 1:
            raise ctx.refuse(
                f"{cls.name.value} holds the MoE layers' pre-MLP norm ({', '.join(norms)}), which this codemod "
                "places only when each experts class, or the dense MLP class the decoder layer builds "
                "instead of them, holds one",
                cls,
                module,
            )
        found.append(ExpertsNorm(cls, norms[0], self_assignments(cls)[norms[0]][0]))
    return found


def layer_mlp_classes(layer) -> set[str]:
    """The names of the classes the decoder layer builds as its MLP
    (``self.mlp = A(config) if dense else B(config)``: both)."""
    names = set()
    for attr, kind in layer.sublayers.items():
        value = self_assignments(layer.init).get(attr)
        if kind != "mlp" or value is None:
            continue
        for node in walk(value[1]):
            if isinstance(node, cst.Call):
                names.add((dotted(node.func) or "").split(".")[-1])
    return names


def _holders(module: cst.Module, cls: cst.ClassDef) -> set[str]:
    """The attributes that hold an instance of ``cls`` (``self.experts =
    <Experts>(config)``, ``self.mlp = <DenseMLP>(config) if ... else ...``)."""
    found = set()
    for other in nodes_of(module, cst.ClassDef):
        for attr, (_, value) in self_assignments(other).items():
            if any(
                isinstance(n, cst.Call) and (dotted(n.func) or "").split(".")[-1] == cls.name.value
                for n in walk(value)
            ):
                found.add(attr)
    return found


def moe_placement(layer) -> str | None:
    """``pre`` or ``sandwich`` for a layer whose MLP calls no norm statement
    precedes (its experts apply the pre-MLP norm): the attention calls
    pre-normed, and both sublayers' outputs normed (sandwich) or neither
    (pre); None for another layer."""
    attention = layer.unfused("attention")
    mlp = layer.unfused("mlp")
    if not attention or not mlp or any(c.pre_norm is None for c in attention):
        return None
    if any(c.pre_norm is not None for c in mlp):
        return None
    shapes = {c.post_norm is not None for c in attention + mlp}
    if len(shapes) != 1:
        return None
    return "sandwich" if shapes.pop() else "pre"


def class_role_of(cls: cst.ClassDef) -> str | None:
    return class_role(cls.name.value)


def one_argument(call: cst.Call) -> str | None:
    """The code of the one positional argument of ``call``, or None."""
    args = call.args
    if len(args) != 1 or args[0].keyword is not None or args[0].star:
        return None
    return cst.Module([]).code_for_node(args[0].value)


def reads_attr(call: cst.Call, attr: str) -> bool:
    """Whether an argument of ``call`` reads ``self.<attr>`` (its weight, its epsilon)."""
    return any(self_attr(n) == attr for arg in call.args for n in walk(arg.value))


def flag_value(cls: cst.ClassDef) -> cst.BaseExpression | None:
    for method in layer_methods(cls):
        for stmt in deep_statements(method):
            pair = self_assignment(stmt)
            if pair is not None and pair[0] == FUSED_FLAG:
                return pair[1]
    return None


def experts_mapping_edits(
    codemod: str, found: ExpertsNorm, new_key: str | None, module, ctx, edits: dict
) -> None:
    """``load_weights``: the norm of an experts class (or of the dense MLP
    built instead of them), whose keys name the attribute holding that class
    and the norm (``<layer>.mlp.experts.<norm>``, ``<layer>.mlp.<norm>``),
    loaded from the checkpoint key of ``new_key`` (the layer's norm it
    computes), or no longer loaded (None)."""
    holders = _holders(module, found.cls)
    entries = [
        e
        for e in mapping_entries_of_attr(module, found.attr)
        if any(has_segment(e.key, f"{h}.{found.attr}") for h in holders)
    ]
    if not entries:
        raise ctx.precondition(
            f"{codemod}: load_weights has no mappings[...] entry for {found.cls.name.value}.{found.attr} "
            f"(a key naming {' / '.join(sorted(holders)) or 'the attribute holding it'}.{found.attr})",
            found.assignment,
            module,
        )
    for entry in entries:
        if new_key is None:
            add_edit(edits, id(entry.statement), lambda updated: cst.RemoveFromParent())
            continue
        value = map_value_strings(entry.value, lambda node: replace_segment(node, found.attr, new_key))
        if value is None:
            raise ctx.precondition(
                f"{codemod}: the checkpoint key of {found.cls.name.value}.{found.attr} does not name "
                f"{found.attr}, so it cannot become {new_key}'s",
                entry.statement,
                module,
            )
        add_edit(edits, id(entry.value), lambda updated, value=value: value)


def unfuse_norm_kernels(codemod: str, why: str, module: cst.Module, ctx, edits: dict) -> None:
    """Every fused decode kernel of the experts that RMS-normalizes their
    input (``NF.moe_block_tkg``, handed the norm's weight as ``gamma``) is
    left for the unfused path: its class's ``self.fused_decode`` flag
    becomes ``False``, so decode runs the norm module, the router and the
    blockwise kernel, and the call, no longer reached, is declared
    unaffected. A class without the flag is refused at the call."""
    from autoport_cst.transform.anatomy.experts import moe_sites, survey

    classes = {c.name.value: c for c in nodes_of(module, cst.ClassDef) if isinstance(c, cst.ClassDef)}
    for site in moe_sites(module, "moe.experts"):
        if site.kind != "block" or not any(
            a.keyword is not None and a.keyword.value == "gamma" for a in site.call.args
        ):
            continue
        flag = survey(classes[site.cls]).assigned.get(FUSED_FLAG) if site.cls in classes else None
        pair = self_assignment(flag) if flag is not None else None
        if pair is None:
            raise ctx.precondition(
                f"{codemod}: {site.cls}.{site.function}: {site.name} fuses an RMSNorm of the MoE input "
                f"({why}), and {site.cls} has no self.{FUSED_FLAG} flag to run an unfused decode instead",
                site.call,
                module,
            )
        value = pair[1]
        if not (isinstance(value, cst.Name) and value.value == "False"):
            edits[id(value)] = lambda updated: cst.Name("False")
        ctx.unaffected(
            site.call, f"not reached: self.{FUSED_FLAG} = False ({site.name} fuses an RMSNorm; {why})"
        )
