"""vision-rope-positions: a tower with 2-D RoPE only, no learned position table (Qwen2-VL, Qwen2.5-VL)."""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from autoport_cst.transform import Codemod, Example, FileContext, PortContext
from autoport_cst.transform.cst.vocabulary import method, self_attr, statements, walk
from autoport_cst.transform.edit.tree import rewrite
from autoport_cst.transform.edit.vision_tower import (
    class_assigning,
    drop_mapping_entries,
    drop_unused_import,
    forward_slice,
    mapping_entries_keyed,
    unused_parameters,
    without_parameters,
)
from autoport_cst.transform.realizes import Realizes, from_to

TABLE = "pos_embed"
TABLE_SIZE = "num_position_embeddings"


@dataclass(frozen=True)
class VisionRopePositionsParams:
    pass


class VisionRopePositions(Codemod):
    """Remove the tower's learned position table: positions by its 2-D RoPE alone.

    Qwen3-VL adds a learned ``pos_embed`` table, resampled to each image's
    patch grid, to the patch embeddings; Qwen2-VL and Qwen2.5-VL have no such
    table (their blocks' 2-D RoPE is their only position signal). In the
    tower's file, the class creating ``self.pos_embed`` loses it, its forward
    loses the statements computing from it (the resampled rows and their add
    to the hidden states) and the parameters only those read (the resampling
    taps). In the model file, the host-side statements reading the table size
    (``num_position_embeddings``: the resampling taps) go, with the keyword
    arguments that passed their results to the tower, the import of the
    function they called when nothing else uses it, and the checkpoint
    mapping keyed ``"<tower>.pos_embed"``.

    Precondition: the model file maps the table.
    """

    ID = "vision-rope-positions"
    REALIZES = Realizes({"vision.positions": from_to("learned_and_rope_2d", "rope_2d")})
    Params = VisionRopePositionsParams
    FILES = ("model", "tower")
    EXAMPLES = (
        Example(
            title="the tower",
            role="tower",
            path="vision_encoder.py",
            before="""
                class Qwen3VLVisionModel(nn.Module):
                    def __init__(self, config):
                        self.patch_embed_weight = nn.Parameter(torch.empty(4, 8))
                        self.pos_embed = nn.Parameter(torch.empty(16, 8))

                    def forward(self, pixel_values, patch_positions, interp_indices, interp_weights):
                        hidden_states = pixel_values @ self.patch_embed_weight
                        table = self.pos_embed[interp_indices].to(torch.float32)
                        positions = (table * interp_weights[..., None]).sum(1)
                        hidden_states = hidden_states + positions.to(self.dtype)
                        return self.blocks(hidden_states, patch_positions)
            """,
            after="""
                class Qwen3VLVisionModel(nn.Module):
                    def __init__(self, config):
                        self.patch_embed_weight = nn.Parameter(torch.empty(4, 8))

                    def forward(self, pixel_values, patch_positions):
                        hidden_states = pixel_values @ self.patch_embed_weight
                        return self.blocks(hidden_states, patch_positions)
            """,
        ),
        Example(
            title="the host side and the checkpoint mapping",
            before="""
                from .vision_preprocessing import patch_rotary_positions, position_interpolation


                class Qwen3VLForConditionalGeneration(nn.Module):
                    def embed_multimodal(self, pixel_values, image_grid_thw):
                        merge = self.vision_config.spatial_merge_size
                        indices, weights = position_interpolation(
                            image_grid_thw, merge, self.vision_config.num_position_embeddings
                        )
                        return self.visual(
                            pixel_values,
                            patch_positions=patch_rotary_positions(image_grid_thw, merge),
                            interp_indices=indices,
                            interp_weights=weights,
                        )

                    def _vision_mappings(self):
                        return {
                            "visual.patch_embed_weight": f"{HF_VISION_PREFIX}.patch_embed.proj.weight",
                            "visual.pos_embed": f"{HF_VISION_PREFIX}.pos_embed.weight",
                        }
            """,
            after="""
                from .vision_preprocessing import patch_rotary_positions


                class Qwen3VLForConditionalGeneration(nn.Module):
                    def embed_multimodal(self, pixel_values, image_grid_thw):
                        merge = self.vision_config.spatial_merge_size
                        return self.visual(
                            pixel_values,
                            patch_positions=patch_rotary_positions(image_grid_thw, merge),
                        )

                    def _vision_mappings(self):
                        return {
                            "visual.patch_embed_weight": f"{HF_VISION_PREFIX}.patch_embed.proj.weight",
                        }
            """,
        ),
        Example(
            title="a model file without the table's mapping",
            before="""
                class LlamaModel(nn.Module):
                    pass
            """,
            raises="no checkpoint mapping keyed '<tower>.pos_embed'",
        ),
    )

    @classmethod
    def params_for(cls, diffs, target, port: PortContext) -> VisionRopePositionsParams:
        return VisionRopePositionsParams()

    def transform_module(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        if ctx.role == "tower":
            tower = class_assigning(module, TABLE)
            return module if tower is None else _drop_table(module, tower)
        entries = mapping_entries_keyed(module, TABLE)
        if not entries:
            if not any(isinstance(n, cst.Attribute) and n.attr.value == TABLE_SIZE for n in walk(module)):
                if mapping_entries_keyed(module, "patch_embed_weight"):
                    return module  # done already
            raise ctx.refuse(f"no checkpoint mapping keyed '<tower>.{TABLE}' in this file")
        return _drop_host_side(drop_mapping_entries(module, entries))


def _drop_table(module: cst.Module, tower: cst.ClassDef) -> cst.Module:
    init, forward = method(tower, "__init__"), method(tower, "forward")
    assert init is not None
    edits: dict[int, object] = {}
    for stmt in statements(init):
        if any(self_attr(n) == TABLE for n in walk(stmt)):
            edits[id(stmt)] = lambda node: cst.RemoveFromParent()
    if forward is not None:
        seeds = {id(s) for s in statements(forward) if any(self_attr(n) == TABLE for n in walk(s))}
        doomed, _ = forward_slice(forward, seeds)
        kept = [s for s in statements(forward) if s not in doomed]
        unused = unused_parameters(forward, kept)
        body = forward.body.with_changes(body=kept)
        new_forward = without_parameters(forward.with_changes(body=body), unused)
        edits[id(forward)] = lambda node: new_forward
    return rewrite(module, edits)


def _drop_host_side(module: cst.Module) -> cst.Module:
    """The statements reading the table size, the keywords passing what they
    defined, and the import of what they called if now unused."""
    edits: dict[int, object] = {}
    called: set[str] = set()
    for func in [n for n in walk(module) if isinstance(n, cst.FunctionDef)]:
        seeds = {
            id(s)
            for s in statements(func)
            if any(isinstance(n, cst.Attribute) and n.attr.value == TABLE_SIZE for n in walk(s))
        }
        if not seeds:
            continue
        doomed, dead = forward_slice(func, seeds)
        seeded = [s for s in doomed if id(s) in seeds]
        called |= {
            n.func.value
            for s in seeded
            for n in walk(s)
            if isinstance(n, cst.Call) and isinstance(n.func, cst.Name)
        }
        for stmt in seeded:
            edits[id(stmt)] = lambda node: cst.RemoveFromParent()
        for call in [n for n in walk(func) if isinstance(n, cst.Call)]:
            if any(isinstance(a.value, cst.Name) and a.value.value in dead and a.keyword for a in call.args):
                edits[id(call)] = lambda node, dead=dead: _without_keywords(node, dead)
    module = rewrite(module, edits)
    for name in sorted(called):
        module = drop_unused_import(module, name)
    return module


def _without_keywords(call: cst.Call, dead: set[str]) -> cst.Call:
    args = [
        a for a in call.args if not (a.keyword and isinstance(a.value, cst.Name) and a.value.value in dead)
    ]
    if args and call.args and args[-1] is not call.args[-1]:
        args[-1] = args[-1].with_changes(comma=call.args[-1].comma)
    return call.with_changes(args=args)
