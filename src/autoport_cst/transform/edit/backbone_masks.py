"""Decode masks the backbone builds once per step, made per attention window.

The real packages' MoE backbone (qwen3_moe) builds the step's decode mask
once, in a module function that calls ``NF.gen_attention_decode_mask`` with
no window (``start_pos=None``), and hands the same mask to every layer
(``layer(..., attn_mask=attn_mask)``). Once layers slide, one mask no longer
fits them all. ``window_backbone_masks`` makes it one mask per window of the
layers, still built once per step (as the gpt_oss package builds a sliding
and a full one):

- the mask function takes ``window`` (None: full attention) and masks the
  prior positions before ``p - window + 1`` (``start_pos``);
- the backbone builds ``{window: <mask function>(..., window) for window in
  {layer.<attention>.sliding_window for layer in self.layers}}``;
- each layer gets the mask of its window.

A mask function that already passes a ``start_pos`` is left alone.
``mask_start_edits`` gives one decode mask the start of its window (the
attention's own masks use it too). ``caller_mask_edits`` is the entry of a
codemod whose attention takes its decode mask from its caller.
``decode_mask_start_edits`` is the decode edit of a codemod that bounds the
prior positions a layer sees (sliding-window, chunked-attention): every
decode kernel call of the attention starts its mask at the layer's bound.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import libcst as cst

from autoport_cst.transform.anatomy.attention import KernelSite, calls_in
from autoport_cst.transform.cst.snippets import parse_expr, parse_statements
from autoport_cst.transform.cst.vocabulary import (
    classes_with_role,
    code_of,
    dotted,
    is_none,
    keyword_arg,
    self_assignment,
    walk,
)
from autoport_cst.transform.edit.arguments import set_keyword
from autoport_cst.transform.edit.kernels import argument, guard_statement, innermost_statement, insert_before
from autoport_cst.transform.edit.tree import with_comment

MASK_KERNEL = "NF.gen_attention_decode_mask"
WINDOW_PARAM = "window"
START_POS = """
start_pos = None
if {window} is not None:
    start_pos = torch.clamp({positions} - ({window} - 1), min=0)
"""
START_COMMENT = "<-- MODEL-SPECIFIC: sliding window: mask prior positions before p - window + 1"
MASKS_COMMENT = (
    "<-- MODEL-SPECIFIC: sliding window: one decode mask per window of the layers, built once per step"
)


@dataclass(frozen=True)
class MaskStart:
    """What bounds the prior positions a layer's decode mask shows: the
    attention attribute holding the layer's bound (None: none), the mask
    function's parameter that takes it, the statements computing
    ``start_pos`` from ``{positions}`` and ``{window}`` (the bound's code),
    and the comments of the edits."""

    attr: str = "sliding_window"
    param: str = WINDOW_PARAM
    start: str = START_POS
    start_comment: str = START_COMMENT
    masks_comment: str = MASKS_COMMENT
    # the module function giving a kernel that masks from pos_ids= its swa_start_pos_ids
    start_function: str = "_window_start"
    # the guard of a context-parallel decode mask (local_filled_slots), which takes no start
    dcp_message: str = ""
    guard_comment: str = ""


WINDOW = MaskStart()


def mask_functions(module: cst.Module) -> list[cst.FunctionDef]:
    """Module-level functions that build a decode mask without a window."""
    found = []
    for stmt in module.body:
        if not isinstance(stmt, cst.FunctionDef):
            continue
        for mask in calls_in(stmt, MASK_KERNEL):
            start = keyword_arg(mask, "start_pos")
            if start is None or is_none(start.value):
                found.append(stmt)
                break
    return found


def window_backbone_masks(
    module: cst.Module, ctx, attention_attr: str, edits: dict, bound: MaskStart = WINDOW
) -> bool:
    """Record the edits that make the backbone's decode masks per window
    (per value of ``bound.attr``); False when no module function builds a
    mask without a window."""
    functions = mask_functions(module)
    if not functions:
        return False
    for function in functions:
        _function_edits(function, module, ctx, edits, bound)
        callers = [
            (cls, call)
            for cls in module.body
            if isinstance(cls, cst.ClassDef)
            for call in walk(cls)
            if isinstance(call, cst.Call) and dotted(call.func) == function.name.value
        ]
        if not callers:
            raise ctx.refuse(
                f"the decode mask of {function.name.value} is built by no class of this file",
                function,
                module,
            )
        for cls, call in callers:
            _backbone_edits(cls, call, attention_attr, module, ctx, edits, bound)
    return True


def caller_mask_edits(
    module: cst.Module,
    ctx,
    attention: list[cst.ClassDef],
    method: cst.FunctionDef,
    codemod: str,
    edits: dict,
    bound: MaskStart = WINDOW,
) -> None:
    """Record the edits for an attention whose decode ``method`` takes its
    mask from its caller: the backbone's masks become one per value of
    ``bound.attr`` of the attention the decoder layers hold. ``codemod``
    refuses when the layers hold the attention under no single name, or when
    nothing in this file builds a mask."""
    names = {cls.name.value for cls in attention}
    attrs = {
        pair[0]
        for layer in classes_with_role(module, "decoder_layer")
        for node in walk(layer)
        if isinstance(node, cst.SimpleStatementLine)
        and (pair := self_assignment(node)) is not None
        and isinstance(pair[1], cst.Call)
        and dotted(pair[1].func) in names
    }
    if len(attrs) != 1:
        raise ctx.precondition(
            f"{codemod}: {method.name.value} takes its decode mask from its caller, and no decoder layer "
            f"of this file holds the attention under one name (found {sorted(attrs)})",
            method,
            module,
        )
    if window_backbone_masks(module, ctx, attrs.pop(), edits, bound):
        return
    if not any(calls_in(function, MASK_KERNEL) for function in module.body):
        raise ctx.precondition(
            f"{codemod}: {method.name.value} takes its decode mask from its caller, and nothing in this "
            f"file builds it ({MASK_KERNEL})",
            method,
            module,
        )


@dataclass
class DecodeMasks:
    """What ``decode_mask_start_edits`` found over the decode kernel calls of
    a codemod's attention classes: whether the module needs
    ``bound.start_function``, the calls whose mask the caller builds, and the
    masks already edited."""

    start_function: bool = False
    outside: list[KernelSite] = field(default_factory=list)
    done: set[int] = field(default_factory=set)


def decode_mask_start_edits(
    site: KernelSite,
    cls: cst.ClassDef,
    module: cst.Module,
    ctx,
    edits: dict,
    found: DecodeMasks,
    codemod: str,
    bound: MaskStart,
    memoized: Callable[..., None],
) -> None:
    """The decode edit of a codemod bounding the prior positions a layer
    sees (``self.<bound.attr>``), for one decode kernel call:

    - a kernel that masks from ``pos_ids=`` gets ``swa_start_pos_ids=
      <bound.start_function>(pos_ids, self.<attr>)``; a start it is already
      given (anything but None, or a local only ever None) is refused;
    - each ``NF.gen_attention_decode_mask`` of the decode method gets the
      start (``mask_start_edits``), the context-parallel one
      (``local_filled_slots``) a guard raising ``bound.dcp_message`` when the
      layer is bounded, and ``memoized(mask, method, where, module, ctx,
      edits)`` handles a mask kept for the next layers; a mask that passes
      another ``start_pos`` is refused;
    - a mask handed in by the caller (a parameter of the decode method) is
      recorded in ``found.outside`` for ``caller_mask_edits``.

    Refuses a decode method that builds no mask and passes no positions."""
    masks = calls_in(site.method, MASK_KERNEL)
    where = site.where(cls)
    own = f"self.{bound.attr}"
    positions = argument(site.call, "pos_ids")
    if positions is not None and not is_none(positions):
        _refuse_given_start(site, where, module, ctx, codemod, bound)
        start = parse_expr(f"{bound.start_function}({code_of(positions)}, {own})", module)
        edits[id(site.call)] = lambda updated: set_keyword(
            updated, "swa_start_pos_ids", start, after=("pos_ids",)
        )
        found.start_function = True
    elif not masks:
        raise ctx.precondition(f"{codemod}: no {MASK_KERNEL}(...) call in {where}", site.method, module)
    given = argument(site.call, "attention_mask")
    params = {p.name.value for p in site.method.params.params}
    if not masks and isinstance(given, cst.Name) and given.value in params:
        found.outside.append(site)  # a mask its caller built (the backbone, once per step)
    for mask in masks:
        if id(mask) in found.done:
            continue
        found.done.add(id(mask))
        filled = keyword_arg(mask, "local_filled_slots")
        if filled is not None and not is_none(filled.value):
            condition = f"{own} is not None and {code_of(filled.value)} is not None"
            guard_statement(
                module, ctx, site.method, mask, condition, bound.dcp_message, edits, bound.guard_comment
            )
        current = keyword_arg(mask, "start_pos")
        if current is not None and dotted(current.value) == "start_pos":
            continue  # masked already (this edit's start_pos)
        if current is not None and not is_none(current.value):
            raise ctx.precondition(
                f"{codemod}: {where} already passes start_pos={code_of(current.value)}", mask, module
            )
        memoized(mask, site.method, where, module, ctx, edits)
        mask_start_edits(module, ctx, site.method, mask, own, where, edits, bound)


def _refuse_given_start(site: KernelSite, where: str, module, ctx, codemod: str, bound: MaskStart) -> None:
    """A decode kernel already given a start of its prior positions (another
    bound than this edit's, or a local set to one) is not bounded twice."""
    given = argument(site.call, "swa_start_pos_ids")
    if given is None or is_none(given) or code_of(given).startswith(f"{bound.start_function}("):
        return
    if isinstance(given, cst.Name):
        values = [
            node.value
            for node in walk(site.method)
            if isinstance(node, cst.Assign)
            and any(isinstance(t.target, cst.Name) and t.target.value == given.value for t in node.targets)
        ]
        if values and all(is_none(value) for value in values):
            return  # a local the method only ever sets to None
    raise ctx.precondition(
        f"{codemod}: {where} already passes swa_start_pos_ids={code_of(given)} to its decode kernel",
        site.call,
        module,
    )


def _function_edits(function: cst.FunctionDef, module, ctx, edits, bound: MaskStart) -> None:
    """``window`` parameter; ``start_pos`` from it on each windowless mask."""
    params = function.params
    if any(p.name.value == bound.param for p in params.params):
        raise ctx.refuse(
            f"{function.name.value} already takes a {bound.param!r} it does not mask with",
            function,
            module,
        )
    param = cst.Param(
        name=cst.Name(bound.param),
        annotation=cst.Annotation(parse_expr("int | None", module)),
        default=cst.Name("None"),
        equal=cst.AssignEqual(cst.SimpleWhitespace(" "), cst.SimpleWhitespace(" ")),
    )
    edits[id(params)] = lambda updated, param=param: _append_param(updated, param)
    for mask in calls_in(function, MASK_KERNEL):
        mask_start_edits(module, ctx, function, mask, bound.param, function.name.value, edits, bound)


def mask_start_edits(
    module, ctx, function, mask: cst.Call, window: str, where: str, edits, bound: MaskStart = WINDOW
) -> None:
    """``start_pos`` of the decode mask ``mask`` in ``function``: from its
    ``pos_ids`` and ``window`` (the code of an ``int | None``), computed
    right before the statement holding it, so that the mask hides the prior
    positions before ``p - window + 1`` (or the start ``bound`` computes)."""
    positions = keyword_arg(mask, "pos_ids")
    if positions is None:
        raise ctx.refuse(f"{MASK_KERNEL} in {where} has no pos_ids= argument", mask, module)
    new = parse_statements(
        bound.start.format(positions=code_of(positions.value), window=window).strip("\n"), module
    )
    new[0] = with_comment(new[0], bound.start_comment)
    start = parse_expr("start_pos", module)
    edits[id(mask)] = lambda updated: set_keyword(updated, "start_pos", start)
    holder = innermost_statement(function, mask)
    if holder is None:  # pragma: no cover - a call always sits in a statement
        raise ctx.refuse("cannot place the window's start before this call", mask, module)
    insert_before(edits, holder, new)


def _append_param(params: cst.Parameters, param: cst.Param) -> cst.Parameters:
    existing = list(params.params)
    if len(existing) > 1 and all(isinstance(p.comma, cst.Comma) for p in existing[-2:]):
        # one parameter a line with a trailing comma: the new one on a line of its own, before ")"
        last = existing[-1].comma
        existing[-1] = existing[-1].with_changes(comma=existing[-2].comma)
        return params.with_changes(params=[*existing, param.with_changes(comma=last)])
    if existing and existing[-1].comma is cst.MaybeSentinel.DEFAULT:
        existing[-1] = existing[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
    return params.with_changes(params=[*existing, param])


def _backbone_edits(
    cls: cst.ClassDef, call: cst.Call, attention_attr: str, module, ctx, edits, bound: MaskStart
):
    """``M = mask(...)`` -> one mask per window; ``layer(..., attn_mask=M)``
    inside the loop over ``self.layers`` -> the mask of the layer's window."""
    where = cls.name.value
    assignment = next(
        (
            node
            for node in walk(cls)
            if isinstance(node, cst.Assign) and node.value is call and len(node.targets) == 1
        ),
        None,
    )
    target = dotted(assignment.targets[0].target) if assignment is not None else None
    if target is None or "." in target:
        raise ctx.refuse(
            f"{where} does not keep its decode mask in a local (mask = {code_of(call.func)}(...))",
            call,
            module,
        )
    loops = [
        loop
        for loop in walk(cls)
        if isinstance(loop, cst.For) and "self.layers" in code_of(loop.iter) and _layer_name(loop) is not None
    ]
    uses = [
        (loop, arg)
        for loop in loops
        for node in walk(loop.body)
        if isinstance(node, cst.Call)
        for arg in node.args
        if arg.keyword is not None and dotted(arg.value) == target
    ]
    if not uses:
        raise ctx.refuse(
            f"{where} hands its decode mask {target} to no layer of a loop over self.layers",
            call,
            module,
        )
    windows = f"{{layer.{attention_attr}.{bound.attr} for layer in self.layers}}"
    # the bound after the call's arguments: by keyword after keywords (the real backbone's call)
    by_keyword = any(a.keyword is not None for a in call.args)
    args = ", ".join(
        [
            *(f"{a.keyword.value}={code_of(a.value)}" if a.keyword else code_of(a.value) for a in call.args),
            f"{bound.param}={bound.param}" if by_keyword else bound.param,
        ]
    )
    per_window = parse_expr(
        f"{{{bound.param}: {code_of(call.func)}({args}) for {bound.param} in {windows}}}", module
    )
    edits[id(call)] = lambda updated, per_window=per_window: per_window
    holder = next(s for s in walk(cls) if isinstance(s, cst.SimpleStatementLine) and assignment in s.body)
    comment = cst.EmptyLine(comment=cst.Comment(f"# {bound.masks_comment}"))
    edits[id(holder)] = lambda updated, comment=comment: updated.with_changes(
        leading_lines=[*updated.leading_lines, comment]
    )
    for loop, arg in uses:
        layer = _layer_name(loop)
        chosen = parse_expr(
            f"None if {target} is None else {target}[{layer}.{attention_attr}.{bound.attr}]", module
        )
        edits[id(arg)] = lambda updated, chosen=chosen: updated.with_changes(value=chosen)


def _layer_name(loop: cst.For) -> str | None:
    """The loop variable holding the layer: ``layer`` of ``for layer in
    self.layers`` or of ``for i, layer in enumerate(self.layers)``."""
    target = loop.target
    if isinstance(target, cst.Name):
        return target.value
    if isinstance(target, cst.Tuple) and len(target.elements) == 2:
        second = target.elements[1].value
        return second.value if isinstance(second, cst.Name) else None
    return None
