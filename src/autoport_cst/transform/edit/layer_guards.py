"""Guards of what a decoder-layer codemod cannot change: the fused-norm
branches of a decoder layer, another model's classes in the package (a
speculative-decoding drafter), and sites handled upstream."""

from __future__ import annotations

import libcst as cst

from autoport_cst.transform import FileContext
from autoport_cst.transform.anatomy.decoder import (
    DecoderLayer,
    decoder_layer,
    fused_norm,
    is_guard,
    layer_methods,
    norm_attrs,
    other_model_classes,
    sublayer_attrs,
    sublayer_calls,
)
from autoport_cst.transform.cst.snippets import parse_statement
from autoport_cst.transform.cst.vocabulary import classes_with_role, is_docstring, walk


def guard_edit(block: cst.IndentedBlock, message: str, module: cst.Module) -> tuple[int, object]:
    """An edit (``(id, fn)`` for ``rewrite``) that makes ``block`` raise
    ``NotImplementedError(message)`` instead of running its statements."""
    stmt = _raise(message, module)
    return id(block), (lambda updated: updated.with_changes(body=[stmt]))


def guard_fused(
    module: cst.Module, ctx: FileContext, layer: DecoderLayer, message: str
) -> tuple[dict, list[cst.IndentedBlock]]:
    """Guard every branch whose sublayer call is handed a norm's weight (a
    fused kernel computes that norm itself): edits and the guarded blocks. A
    fused call outside a branch cannot be guarded and is refused."""
    edits: dict = {}
    blocks = []
    for call in layer.calls():
        if call.fused is None:
            continue
        if call.block is None:
            raise ctx.refuse(
                f"{layer.name} hands self.{call.fused}'s weight to self.<{call.kind}> outside "
                "an if/else branch: the fused kernel cannot compute the change, and there is no branch to guard",
                call.stmt,
                module,
            )
        key, edit = guard_edit(call.block, message, module)
        edits[key] = edit
        blocks.append(call.block)
    return edits, blocks


def guard_fused_norms(
    module: cst.Module, ctx: FileContext, message: str
) -> tuple[dict, list[cst.IndentedBlock]]:
    """For a codemod that changes what the norms compute into something a
    fused RMSNorm kernel cannot: guard every branch of the decoder layer
    whose sublayer call is handed a norm's weight (``guard_fused``); nothing
    when no call is."""
    layers = classes_with_role(module, "decoder_layer")
    if len(layers) != 1:
        return {}, []
    attrs, norms = sublayer_attrs(layers[0]), norm_attrs(layers[0])
    if not any(fused_norm(c, norms) for c in sublayer_calls(layers[0], attrs)):
        return {}, []
    layer = decoder_layer(module, ctx)
    return guard_fused(module, ctx, layer, message) if layer is not None else ({}, [])


def declare_upstream(
    module: cst.Module,
    ctx: FileContext,
    family: str,
    func: cst.FunctionDef,
    anchor: cst.BaseStatement,
    reason: str,
) -> None:
    """Declare the sites of ``family`` in the top-level statements of
    ``func`` before ``anchor`` as handled at ``anchor``: a change made at a
    top-level statement that every path from them to the rest of ``func``
    runs through (no ``return`` before it), where the census, which looks one
    hop past a site, cannot see it."""
    from autoport_cst.transform.anatomy.sites import find_sites

    body = list(func.body.body)
    before = body[: body.index(anchor)]
    if any(isinstance(n, cst.Return) for stmt in before for n in walk(stmt)):
        return
    inside = {id(n) for stmt in before for n in walk(stmt)}
    for site in find_sites(module, family):
        if id(site.node) in inside:
            ctx.unaffected(site.node, reason)


def leave_other_model(module: cst.Module, ctx: FileContext, families: tuple[str, ...], change: str) -> None:
    """Declare the sites of ``families`` in another model's classes (a
    module file) unaffected: ``change`` is the target model's, not theirs."""
    from autoport_cst.transform.anatomy.sites import find_sites

    reason = f"another model ({ctx.path}: a drafter keeps its own architecture): {change} is the target's"
    for family in families:
        for site in find_sites(module, family):
            ctx.unaffected(site.node, reason)


def guard_other_model(
    module: cst.Module, ctx: FileContext, families: tuple[str, ...], message: str
) -> cst.Module:
    """Make each model class of a module file raise ``NotImplementedError``
    when built (first statement of its ``__init__``), for a change that
    reaches it through the classes it is built on but that it does not
    compute (a drafter whose norms or layer come from the model's classes);
    its sites are declared guarded."""
    from autoport_cst.transform.anatomy.sites import find_sites
    from autoport_cst.transform.edit.tree import rewrite

    for family in families:
        for site in find_sites(module, family):
            ctx.unaffected(site.node, f"guarded: {message}")
    edits: dict = {}
    for cls in other_model_classes(module):
        init = next((f for f in layer_methods(cls) if f.name.value == "__init__"), None)
        if init is None or not isinstance(init.body, cst.IndentedBlock):
            continue
        body = list(init.body.body)
        start = 1 if body and is_docstring(body[0]) else 0
        if start < len(body) and is_guard(cst.IndentedBlock(body=[body[start]])):
            continue
        stmt = _raise(message, module)
        edits[id(init.body)] = lambda updated, start=start, stmt=stmt: updated.with_changes(
            body=[*updated.body[:start], stmt, *updated.body[start:]]
        )
    return rewrite(module, edits)


def _raise(message: str, module: cst.Module) -> cst.BaseStatement:
    text = message.replace("\\", "\\\\").replace('"', '\\"')
    return parse_statement(f'raise NotImplementedError("{text}")', module)


def other_model_file(
    module: cst.Module, ctx: FileContext, families: tuple[str, ...], change: str, guard: bool = False
) -> cst.Module:
    """A codemod of the target model in a module file: nothing to do without
    model classes; otherwise their sites are left to them (their
    architecture is their own), or, with ``guard``, they are guarded because
    ``change`` reaches them through the classes they are built on."""
    if not other_model_classes(module):
        return module
    if guard:
        message = (
            f"{change}: a model of this file is built on classes of the ported model that the change alters"
        )
        return guard_other_model(module, ctx, families, message)
    leave_other_model(module, ctx, families, change)
    return module
