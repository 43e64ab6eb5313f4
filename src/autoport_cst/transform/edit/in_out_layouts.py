"""The ``[in, out]`` checkpoint layout edits of checkpoint-keys: the
projection loaders of the attention and MLP classes (or the named
parameters) stop transposing, for a checkpoint that stores its linear
weights ``[in, out]`` (GPT-2's Conv1D); a quantized layer without such
loaders is guarded instead."""

from __future__ import annotations

from collections.abc import Iterable

import libcst as cst

from autoport_cst.transform.anatomy.classes import is_quantized
from autoport_cst.transform.anatomy.loaders import find_loaders
from autoport_cst.transform.base import FileContext
from autoport_cst.transform.cst.vocabulary import classes, classes_with_role, dotted
from autoport_cst.transform.edit.guards import declare_guarded, guard_edit
from autoport_cst.transform.edit.loaders import TRANSPOSING_LOADERS, LoaderEdits, not_transposed
from autoport_cst.transform.edit.parameters import kwarg_code

GUARD_LAYOUT = "checkpoint-keys: [in, out] checkpoint tensors are not implemented for this quantized layer"


def layout_edits(
    codemod: str,
    in_out_params: Iterable[str],
    in_out_layers: bool,
    layers_elsewhere: bool,
    module: cst.Module,
    ctx: FileContext,
) -> dict:
    """Edits making the loaders of ``in_out_params`` (and, with
    ``in_out_layers``, of every transposing projection loader of the
    attention and MLP classes) read ``[in, out]`` tensors as stored.
    ``layers_elsewhere``: this file holds no causal LM class and its layers
    may be in another file of the package."""
    wanted = set(in_out_params)
    edits: dict = {}
    if in_out_layers:
        layer_classes = classes_with_role(module, "attention") + classes_with_role(module, "mlp")
        if not layer_classes:
            if layers_elsewhere or not wanted:
                return {}
            raise ctx.precondition(f"{codemod}: no attention or MLP class (<Prefix>Attention, <Prefix>MLP)")
        for cls in layer_classes:
            if is_quantized(cls) and not find_loaders(cls):
                edits.update(guard_edit(cls, GUARD_LAYOUT, module))
                declare_guarded(cls, ctx, GUARD_LAYOUT)
                continue
            for attr, sites in find_loaders(cls).items():
                if attr.endswith("_weight") and any(
                    s.base is not None and dotted(s.base.func) in TRANSPOSING_LOADERS for s in sites
                ):
                    wanted.add(attr)
        if not wanted and not edits:
            raise ctx.precondition(
                f"{codemod}: no projection weight of the attention and MLP classes has a transposing loader"
            )
    seen: set[str] = set()
    for cls in classes(module):
        loaders = LoaderEdits(module, ctx, cls)
        for attr in sorted(wanted & set(loaders.found)):
            seen.add(attr)
            if _stop_transposing(codemod, loaders, attr, module, ctx):
                loaders.replace_base(attr, not_transposed)
        edits.update(loaders.edits())
    missing = sorted(wanted - seen)
    if missing and not layers_elsewhere:
        raise ctx.precondition(
            f"{codemod}: no loader attached to {', '.join(missing)} (set_weight_loader(self.<attr>, ...))"
        )
    return edits


def _stop_transposing(
    codemod: str, loaders: LoaderEdits, attr: str, module: cst.Module, ctx: FileContext
) -> bool:
    """Whether ``attr``'s loaders transpose (each must be a transposing
    loader; a loader shared with parameters that stay is split)."""
    transposing = False
    for site in loaders.require(attr):
        name = dotted(site.base.func) if site.base is not None else None
        if site.base is None or name not in TRANSPOSING_LOADERS:
            raise ctx.precondition(
                f"{codemod}: the loader of {attr} is {name} ({site.describe()}), not one of "
                f"{', '.join(TRANSPOSING_LOADERS)}",
                site.base,
                module,
            )
        transposing = transposing or kwarg_code(site.base, "is_storage_transposed") not in (None, "False")
    return transposing
