"""The dense MLP classes of a model file (``<Prefix>MLP`` with their
``NF.mlp`` calls), each call's weight attributes, and the MLP weights a file
maps without defining them."""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from autoport_cst.transform import FileContext
from autoport_cst.transform.anatomy.classes import is_quantized
from autoport_cst.transform.cst.roles import class_role
from autoport_cst.transform.cst.vocabulary import (
    classes_with_role,
    dotted,
    keyword_arg,
    positional_args,
    self_attr,
    walk,
)

TORCH_MLP = "torch_mlp"  # the plain-torch MLP of mlp-activation, NF.mlp's arguments


MLP_CALLS = ("NF.mlp", TORCH_MLP)


@dataclass
class MlpClass:
    """A ``<Prefix>MLP`` class with its dense MLP kernel calls."""

    cls: cst.ClassDef
    calls: list[cst.Call]
    quantized: bool

    @property
    def name(self) -> str:
        return self.cls.name.value


def mlp_classes(module: cst.Module, ctx: FileContext) -> list[MlpClass]:
    """Every MLP class of the file with its ``NF.mlp`` calls (none for a
    file without MLP classes, when the package has one elsewhere); an MLP
    class without such a call, or a package without any MLP class, is a
    precondition error."""
    found = []
    for cls in classes_with_role(module, "mlp"):
        calls = [n for n in walk(cls) if isinstance(n, cst.Call) and dotted(n.func) in MLP_CALLS]
        found.append(MlpClass(cls, calls, is_quantized(cls)))
    with_calls = [m for m in found if m.calls]
    if found and not with_calls:
        names = ", ".join(m.name for m in found)
        raise ctx.refuse(
            f"expected one <Prefix>MLP class with one NF.mlp(...) call in this file (MLP classes: {names})"
        )
    if not found and not any(class_role(name) == "mlp" for name in ctx.port.package_classes):
        raise ctx.refuse("no <Prefix>MLP class in the package")
    return with_calls


MLP_SUBLAYERS = ("mlp", "feed_forward")


def mlp_mapping_weights(module: cst.Module) -> list[str]:
    """The MLP weights a file maps without defining the MLP class (another
    model class over the same backbone, such as an embedding model): the
    ``<x>_weight`` leaves of mapping keys right under an MLP sublayer
    (``...mlp.<x>_weight``), in order."""
    from autoport_cst.transform.anatomy.mappings import mapping_entries

    found: list[str] = []
    for entry in mapping_entries(module):
        segments = entry.key.split(".")
        leaf = segments[-1]
        if (
            len(segments) >= 2
            and segments[-2] in MLP_SUBLAYERS
            and leaf.endswith("_weight")
            and leaf not in found
        ):
            found.append(leaf)
    return found


# -- the dense MLP call -----------------------------------------------------------


@dataclass
class MLPCall:
    """An ``NF.mlp(x, gate_w, up_w, down_w, ...)`` call (or the plain-torch
    ``torch_mlp`` with the same arguments) and its weight attributes."""

    call: cst.Call
    gate: str | None
    up: str
    down: str

    @property
    def gated(self) -> bool:
        arg = keyword_arg(self.call, "skip_gate")
        return arg is None or dotted(arg.value) != "True"


def parse_mlp_call(module: cst.Module, ctx: FileContext, call: cst.Call) -> MLPCall:
    args = positional_args(call)
    attrs = [self_attr(a.value) for a in args[1:4]]
    if len(args) < 4 or attrs[1] is None or attrs[2] is None:
        raise ctx.refuse(
            f"expected {dotted(call.func)}(hidden, self.<gate>, self.<up>, self.<down>, ...) "
            "with the weights as positional arguments",
            call,
            module,
        )
    return MLPCall(call, attrs[0], attrs[1], attrs[2])


# Every dense MLP class of a file (quantized ones flagged): ``loaders.mlp_classes``
# (re-exported above).


# Keyword order of NF.mlp (its signature): codemods insert keywords in this
# order whatever order they run in, so that they commute.
MLP_KEYWORDS = (
    "eps",
    "ln_w",
    "skip_gate",
    "act_fn",
    "act_params",
    "gate_b",
    "up_b",
    "down_b",
    "norm_b",
    "norm_type",
)
