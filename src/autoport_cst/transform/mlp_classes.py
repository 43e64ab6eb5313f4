"""The dense MLP classes of a model file (``<Prefix>MLP`` with their
``NF.mlp`` calls) and the MLP weights a file maps without defining them."""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from autoport_cst.transform.base import FileContext
from autoport_cst.transform.cst_helpers import classes_with_role, dotted, walk
from autoport_cst.transform.guards import is_quantized
from autoport_cst.transform.roles import class_role

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


def mlp_classes(module: cst.Module, ctx: FileContext, codemod_id: str) -> list[MlpClass]:
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
        raise ctx.precondition(
            f"{codemod_id}: expected one <Prefix>MLP class with one NF.mlp(...) call in this file "
            f"(MLP classes: {names})"
        )
    if not found and not any(class_role(name) == "mlp" for name in ctx.port.package_classes):
        raise ctx.precondition(f"{codemod_id}: no <Prefix>MLP class in the package")
    return with_calls


MLP_SUBLAYERS = ("mlp", "feed_forward")


def mlp_mapping_weights(module: cst.Module) -> list[str]:
    """The MLP weights a file maps without defining the MLP class (another
    model class over the same backbone, such as an embedding model): the
    ``<x>_weight`` leaves of mapping keys right under an MLP sublayer
    (``...mlp.<x>_weight``), in order."""
    from autoport_cst.transform.mappings import mapping_entries

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
