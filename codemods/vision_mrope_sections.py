"""vision-mrope-sections: M-RoPE frequency pairs in contiguous T, H, W sections (Qwen2-VL, Qwen2.5-VL)."""

from __future__ import annotations

from dataclasses import dataclass

import libcst as cst

from autoport_cst.transform import Codemod, Example, FileContext, PortContext
from autoport_cst.transform.cst.vocabulary import classes_with_role, code_of, method
from autoport_cst.transform.edit.functions import parse_method
from autoport_cst.transform.edit.tree import replace_method
from autoport_cst.transform.realizes import Realizes, from_to

AXIS_METHOD = "_axis_of_pair"

CONTIGUOUS = '''
def _axis_of_pair(self, device: torch.device) -> torch.Tensor:
    """[Dh/2]: the position row (0 T, 1 H, 2 W) each frequency pair reads:
    contiguous sections, the first mrope_section[0] pairs temporal, then
    mrope_section[1] height pairs, then mrope_section[2] width pairs."""
    sections = torch.tensor(self.mrope_section, device=device)
    rows = torch.arange(len(self.mrope_section), device=device) % 3
    return torch.repeat_interleave(rows, sections)
'''


@dataclass(frozen=True)
class VisionMropeSectionsParams:
    pass


class VisionMropeSections(Codemod):
    """Deal the M-RoPE frequency pairs to the T, H, W position rows in contiguous sections.

    Qwen3-VL interleaves them (T, H, W, T, H, W, ...; the rest temporal);
    Qwen2-VL and Qwen2.5-VL split the ``head_dim / 2`` pairs into
    ``mrope_section`` runs, the first temporal, the second height, the third
    width (transformers' ``freq.split(mrope_section)``, section ``i`` taking
    row ``i % 3``). The rotary module's ``_axis_of_pair`` (the row each pair
    reads) is replaced; cos/sin and their users are unchanged.

    Precondition: a rotary-embedding class with an ``_axis_of_pair`` method
    in the model file.
    """

    ID = "vision-mrope-sections"
    REALIZES = Realizes({"vision.mrope_interleaved": from_to(True, False)})
    Params = VisionMropeSectionsParams
    FILES = ("model",)
    EXAMPLES = (
        Example(
            title="Qwen2-VL",
            before='''
                class Qwen3VLTextRotaryEmbedding(nn.Module):
                    def _axis_of_pair(self, device: torch.device) -> torch.Tensor:
                        """Interleaved."""
                        pair = torch.arange(self.head_dim // 2, device=device)
                        axis = torch.zeros_like(pair)
                        for row in (1, 2):
                            axis = torch.where((pair % 3 == row) & (pair < 3 * self.mrope_section[row]), row, axis)
                        return axis
            ''',
            after='''
                class Qwen3VLTextRotaryEmbedding(nn.Module):
                    def _axis_of_pair(self, device: torch.device) -> torch.Tensor:
                        """[Dh/2]: the position row (0 T, 1 H, 2 W) each frequency pair reads:
                        contiguous sections, the first mrope_section[0] pairs temporal, then
                        mrope_section[1] height pairs, then mrope_section[2] width pairs."""
                        sections = torch.tensor(self.mrope_section, device=device)
                        rows = torch.arange(len(self.mrope_section), device=device) % 3
                        return torch.repeat_interleave(rows, sections)
            ''',
        ),
        Example(
            title="a 1-D rotary table",
            before="""
                class LlamaRotaryEmbedding(nn.Module):
                    def forward(self, position_ids):
                        return position_ids
            """,
            raises="no rotary-embedding class with an _axis_of_pair method",
        ),
    )

    @classmethod
    def params_for(cls, diffs, target, port: PortContext) -> VisionMropeSectionsParams:
        return VisionMropeSectionsParams()

    def transform_module(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        found = [(c, method(c, AXIS_METHOD)) for c in classes_with_role(module, "rotary")]
        found = [(c, m) for c, m in found if m is not None]
        if len(found) != 1:
            raise ctx.refuse(f"no rotary-embedding class with an {AXIS_METHOD} method (found {len(found)})")
        cls, old = found[0]
        new = parse_method(CONTIGUOUS, module)
        if code_of(old).strip() == code_of(new.with_changes(leading_lines=old.leading_lines)).strip():
            return module
        new = new.with_changes(leading_lines=old.leading_lines)
        return module.deep_replace(cls, replace_method(cls, old, new))
