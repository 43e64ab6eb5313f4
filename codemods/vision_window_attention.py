"""vision-window-attention: tower blocks attending within windows, some over the whole image (Qwen2.5-VL)."""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from autoport_cst.transform import Codemod, Example, FileContext, PortContext
from autoport_cst.transform.cst.snippets import parse_expr, parse_statement, parse_statements
from autoport_cst.transform.cst.vocabulary import (
    classes_with_role,
    dotted,
    method,
    self_attr,
    statements,
    walk,
)
from autoport_cst.transform.edit import window_attention_code as code
from autoport_cst.transform.edit.functions import add_functions
from autoport_cst.transform.edit.imports import ensure_import_from
from autoport_cst.transform.edit.tree import Edit, rewrite, with_comment
from autoport_cst.transform.realizes import Realizes, from_to

SPANS = "frame_spans"
HOST_METHOD = "embed_multimodal"
MARK_FIELD = "out_hidden_size"


@dataclass(frozen=True)
class VisionWindowAttentionParams:
    pass


class VisionWindowAttention(Codemod):
    """Window attention in the tower: most blocks attend within windows, ``fullatt_block_indexes`` over the frame.

    Qwen2.5-VL's tower reorders its patches so that each window of
    ``window_size // merge // patch_size`` merged tokens a side is contiguous;
    the blocks in ``fullatt_block_indexes`` attend over each frame as before,
    the others within each window; the merged tokens are put back in order
    after the merger. The port does the reordering on the host, where the
    tower's inputs are made: the patch rows and their RoPE positions are
    taken in window order (each merged token's ``merge ** 2`` patches stay
    together, so the merger folds the same patches), and the merged tokens and
    deep-stack rows are restored by the inverse order. Files:
    ``vision_preprocessing.py`` gets ``window_partition`` (the order and the
    windows' spans of patch rows); the tower's forward takes ``window_spans``
    and gives each block the frame spans or the window spans; the vision
    config reads ``window_size`` and ``fullatt_block_indexes``; the model's
    ``embed_multimodal`` partitions and reorders.

    Precondition: the tower's block loop ``for <i>, <block> in
    enumerate(self.blocks)`` passing ``frame_spans``, and ``embed_multimodal``
    returning the tower's call.
    """

    ID = "vision-window-attention"
    REALIZES = Realizes({"vision.attention": from_to("full", "window")})
    Params = VisionWindowAttentionParams
    FILES = ("model", "tower", "config")
    EXAMPLES = (
        Example(
            title="the tower's block loop",
            role="tower",
            path="vision_encoder.py",
            before="""
                class Qwen3VLVisionModel(nn.Module):
                    def __init__(self, config):
                        self.blocks = nn.ModuleList([Qwen3VLVisionBlock(config) for _ in range(config.depth)])

                    def forward(self, pixel_values, frame_spans: list[tuple[int, int]]):
                        hidden_states = pixel_values
                        for index, block in enumerate(self.blocks):
                            hidden_states = block(hidden_states, frame_spans)
                        return hidden_states
            """,
            after="""
                class Qwen3VLVisionModel(nn.Module):
                    def __init__(self, config):
                        self.blocks = nn.ModuleList([Qwen3VLVisionBlock(config) for _ in range(config.depth)])
                        self.full_attention_blocks = list(config.fullatt_block_indexes)

                    def forward(self, pixel_values, frame_spans: list[tuple[int, int]], window_spans: list[tuple[int, int]] | None = None):
                        hidden_states = pixel_values
                        for index, block in enumerate(self.blocks):
                            hidden_states = block(hidden_states, frame_spans if window_spans is None or index in self.full_attention_blocks else window_spans)
                        return hidden_states
            """,
        ),
        Example(
            title="the host side",
            before="""
                from .vision_preprocessing import image_patch_spans


                class Qwen3VLForConditionalGeneration(nn.Module):
                    def embed_multimodal(self, pixel_values, image_grid_thw):
                        merge = self.vision_config.spatial_merge_size
                        return self.visual(
                            pixel_values,
                            patch_positions=patch_rotary_positions(image_grid_thw, merge),
                            frame_spans=image_patch_spans(image_grid_thw),
                        )
            """,
            after="""
                from .vision_preprocessing import image_patch_spans
                from .vision_preprocessing import window_partition


                class Qwen3VLForConditionalGeneration(nn.Module):
                    def embed_multimodal(self, pixel_values, image_grid_thw):
                        merge = self.vision_config.spatial_merge_size
                        # <-- MODEL-SPECIFIC: window attention: the patches in window order, the merged tokens back after
                        order, window_spans = window_partition(
                            image_grid_thw, merge, self.vision_config.window_size, self.vision_config.patch_size
                        )
                        rows = (order.view(-1, 1) * (merge * merge) + torch.arange(merge * merge)).reshape(-1)
                        merged, deepstack = self.visual(
                            pixel_values[rows],
                            patch_positions=patch_rotary_positions(image_grid_thw, merge)[rows],
                            frame_spans=image_patch_spans(image_grid_thw),
                            window_spans=window_spans,
                        )
                        restore = torch.argsort(order)
                        return merged[restore], deepstack[:, restore]
            """,
        ),
        Example(
            title="no tower call to reorder",
            before="""
                class LlamaForCausalLM(nn.Module):
                    pass
            """,
            raises="no embed_multimodal method returning the tower's call",
        ),
    )

    @classmethod
    def params_for(cls, diffs, target, port: PortContext) -> VisionWindowAttentionParams:
        return VisionWindowAttentionParams()

    def transform_module(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        if ctx.role == "tower":
            if ctx.path.endswith("vision_preprocessing.py"):
                return add_functions(module, [code.WINDOW_PARTITION])
            return _tower(module, ctx)
        if ctx.role == "config":
            return _config(module, ctx)
        return _host(module, ctx)


def _tower(module: cst.Module, ctx: FileContext) -> cst.Module:
    for cls in classes_with_role(module, "backbone"):
        init, forward = method(cls, "__init__"), method(cls, "forward")
        loop = next((n for n in walk(forward) if isinstance(n, cst.For) and _enumerates_blocks(n)), None)
        if init is None or forward is None or loop is None:
            continue
        if any(self_attr(n) == "full_attention_blocks" for n in walk(init)):
            return module
        index = loop.target.elements[0].value  # type: ignore[attr-defined]
        spans = [n for n in walk(loop.body) if isinstance(n, cst.Arg) and _is_name(n.value, SPANS)]
        if not spans:
            raise ctx.refuse(f"the block loop passes no {SPANS}", loop, module)
        choice = parse_expr(
            f"{SPANS} if window_spans is None or {index.value} in self.full_attention_blocks else window_spans",
            module,
        )
        edits: dict[int, Edit] = {
            id(arg): (lambda a, choice=choice: a.with_changes(value=choice)) for arg in spans
        }
        assign = parse_statement("self.full_attention_blocks = list(config.fullatt_block_indexes)", module)
        last = statements(init)[-1]
        edits[id(last)] = lambda node, assign=assign: cst.FlattenSentinel([node, assign])
        param = cst.Param(
            cst.Name("window_spans"),
            annotation=cst.Annotation(parse_expr("list[tuple[int, int]] | None", module)),
            default=cst.Name("None"),
        )
        edits[id(forward.params)] = lambda p, param=param: p.with_changes(params=[*p.params, param])
        return rewrite(module, edits)
    raise ctx.refuse("no tower class with a 'for <i>, <block> in enumerate(self.blocks)' loop in its forward")


def _enumerates_blocks(loop: cst.For) -> bool:
    call = loop.iter
    return (
        isinstance(call, cst.Call)
        and dotted(call.func) == "enumerate"
        and bool(call.args)
        and self_attr(call.args[0].value) == "blocks"
        and isinstance(loop.target, cst.Tuple)
    )


def _is_name(node: cst.CSTNode, name: str) -> bool:
    return isinstance(node, cst.Name) and node.value == name


def _config(module: cst.Module, ctx: FileContext) -> cst.Module:
    for cls in classes_with_role(module, "config"):
        lines = [s for s in statements(cls) if isinstance(s, cst.SimpleStatementLine)]
        names = {
            a.target.value
            for s in lines
            for a in s.body
            if isinstance(a, cst.AnnAssign) and isinstance(a.target, cst.Name)
        }
        if MARK_FIELD not in names:
            continue
        if "fullatt_block_indexes" in names:
            return module
        anchor = next(
            (
                s
                for s in lines
                if isinstance(s.body[0], cst.AnnAssign) and _is_name(s.body[0].target, "torch_dtype")
            ),
            None,
        )
        if anchor is None:
            raise ctx.refuse(
                "the vision config has no torch_dtype field to add the window fields before", cls, module
            )
        new = [parse_statement(f, module) for f in code.FIELDS_CODE]
        return rewrite(module, {id(anchor): lambda node, new=new: cst.FlattenSentinel([*new, node])})
    raise ctx.refuse(f"no config class with an {MARK_FIELD} field")


def _host(module: cst.Module, ctx: FileContext) -> cst.Module:
    site = _tower_return(module)
    if site is None:
        if any(isinstance(n, cst.Name) and n.value == "window_partition" for n in walk(module)):
            return module
        raise ctx.refuse(f"no {HOST_METHOD} method returning the tower's call")
    stmt, call = site
    args = list(call.args)
    args[0] = args[0].with_changes(
        value=cst.Subscript(args[0].value, [cst.SubscriptElement(cst.Index(cst.Name("rows")))])
    )
    for i, arg in enumerate(args):
        if arg.keyword is not None and arg.keyword.value == "patch_positions":
            args[i] = arg.with_changes(
                value=cst.Subscript(arg.value, [cst.SubscriptElement(cst.Index(cst.Name("rows")))])
            )
    window = args[-1].with_changes(keyword=cst.Name("window_spans"), value=cst.Name("window_spans"))
    args = [*args[:-1], args[-1].with_changes(comma=args[0].comma), window]
    before = parse_statements(code.BEFORE_CALL, module)
    before[0] = with_comment(before[0], code.COMMENT)
    call_stmt = parse_statement("merged, deepstack = tower_call", module)
    assign = call_stmt.body[0]  # type: ignore[attr-defined]
    call_stmt = call_stmt.with_changes(body=[assign.with_changes(value=call.with_changes(args=args))])
    after = parse_statements(code.AFTER_CALL, module)
    module = rewrite(module, {id(stmt): lambda node: cst.FlattenSentinel([*before, call_stmt, *after])})
    return ensure_import_from(module, ".vision_preprocessing", "window_partition")


def _tower_return(module: cst.Module) -> tuple[cst.SimpleStatementLine, cst.Call] | None:
    for func in [n for n in walk(module) if isinstance(n, cst.FunctionDef) and n.name.value == HOST_METHOD]:
        for stmt in statements(func):
            if isinstance(stmt, cst.SimpleStatementLine) and isinstance(stmt.body[0], cst.Return):
                value = stmt.body[0].value
                if isinstance(value, cst.Call) and self_attr(value.func) is not None and value.args:
                    return stmt, value
    return None
