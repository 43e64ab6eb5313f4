"""vision-patch-bias: a patch embedding without a bias (Qwen2-VL, Qwen2.5-VL)."""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from autoport_cst.transform import Codemod, Example, FileContext, PortContext
from autoport_cst.transform.edit.vision_tower import (
    class_assigning,
    drop_added_parameter,
    drop_mapping_entries,
    mapping_entries_keyed,
)
from autoport_cst.transform.realizes import Realizes, to

BIAS = "patch_embed_bias"


@dataclass(frozen=True)
class VisionPatchBiasParams:
    pass


class VisionPatchBias(Codemod):
    """Drop the vision tower's patch-embedding bias.

    Qwen2-VL and Qwen2.5-VL build their ``Conv3d`` patch embedding with
    ``bias=False`` (the checkpoint has no ``patch_embed.proj.bias``). In the
    tower's file, the class whose ``__init__`` creates ``self.patch_embed_bias``
    loses it (its parameter and weight-loader statements) and the forward's
    ``<patches> @ self.patch_embed_weight + self.patch_embed_bias`` keeps the
    product; in the model file, the checkpoint mapping entry keyed
    ``"<tower>.patch_embed_bias"`` goes. Any other read of the bias is refused
    at its position.

    Precondition: the model file maps the bias (its ``load_weights`` would
    otherwise ask the checkpoint for a tensor it does not hold).
    """

    ID = "vision-patch-bias"
    REALIZES = Realizes({"vision.patch_bias": to(False)})
    Params = VisionPatchBiasParams
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
                        self.patch_embed_bias = nn.Parameter(torch.empty(8))
                        set_weight_loader(self.patch_embed_weight, patch_embed_weight_loader())

                    def forward(self, pixel_values):
                        hidden_states = pixel_values @ self.patch_embed_weight + self.patch_embed_bias
                        return hidden_states
            """,
            after="""
                class Qwen3VLVisionModel(nn.Module):
                    def __init__(self, config):
                        self.patch_embed_weight = nn.Parameter(torch.empty(4, 8))
                        set_weight_loader(self.patch_embed_weight, patch_embed_weight_loader())

                    def forward(self, pixel_values):
                        hidden_states = pixel_values @ self.patch_embed_weight
                        return hidden_states
            """,
        ),
        Example(
            title="its checkpoint mapping",
            before="""
                def _vision_mappings(self):
                    mappings = {
                        "visual.patch_embed_weight": f"{HF_VISION_PREFIX}.patch_embed.proj.weight",
                        "visual.patch_embed_bias": f"{HF_VISION_PREFIX}.patch_embed.proj.bias",
                    }
            """,
            after="""
                def _vision_mappings(self):
                    mappings = {
                        "visual.patch_embed_weight": f"{HF_VISION_PREFIX}.patch_embed.proj.weight",
                    }
            """,
        ),
        Example(
            title="a model file without the tower's mappings",
            before="""
                class LlamaModel(nn.Module):
                    pass
            """,
            raises="no checkpoint mapping keyed '<tower>.patch_embed_bias'",
        ),
    )

    @classmethod
    def params_for(cls, diffs, target, port: PortContext) -> VisionPatchBiasParams:
        return VisionPatchBiasParams()

    def transform_module(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        if ctx.role == "tower":
            tower = class_assigning(module, BIAS)
            return module if tower is None else drop_added_parameter(module, ctx, tower, BIAS)
        entries = mapping_entries_keyed(module, BIAS)
        if not entries:
            if class_assigning(module, "patch_embed_weight") is None and _already_dropped(module):
                return module
            raise ctx.refuse(f"no checkpoint mapping keyed '<tower>.{BIAS}' in this file")
        return drop_mapping_entries(module, entries)


def _already_dropped(module: cst.Module) -> bool:
    """The mapping of the patch-embedding weight is there, the bias's is not: done."""
    return bool(mapping_entries_keyed(module, "patch_embed_weight"))
