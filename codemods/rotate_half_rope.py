"""rotate-half-rope: RoPE on the halves (j, j + d/2), fixed in the code of a reference that reads the pairing."""

from __future__ import annotations

import libcst as cst

from autoport_cst.transform import Codemod, Example, FileContext
from autoport_cst.transform.cst.vocabulary import code_of, self_assignment, walk
from autoport_cst.transform.edit.tree import rewrite, with_comment
from autoport_cst.transform.realizes import Realizes, from_to

ID = "rotate-half-rope"
FLAG = "rope_interleave"
COMMENT = "<-- MODEL-SPECIFIC: rotary pairs are the halves (j, j + d/2), whatever the config says"


class RotateHalfRope(Codemod):
    """RoPE on the halves ``(j, j + d/2)`` of each rotated head part, instead of adjacent pairs.

    The deepseek_v3 reference rotates adjacent pairs ``(2j, 2j + 1)`` or the
    halves as ``config.rope_interleave`` says (DeepSeek's default: pairs).
    MiniCPM3 has the same multi-latent attention and always rotates the
    halves (``apply_rotary_pos_emb`` with ``rotate_half``); its config has no
    ``rope_interleave``, so the reference's default would pair wrongly. Every
    ``self.rope_interleave = <expression>`` of the model file becomes
    ``self.rope_interleave = False``; the code that reads the attribute (the
    queries' and the latent row's rotation, prefill and decode alike) and the
    checkpoint layout are unchanged.

    Preconditions: at least one ``self.rope_interleave = ...`` assignment.
    """

    ID = ID
    REALIZES = Realizes({"rope.style": from_to("interleaved", "rotate_half")})
    EXAMPLES = (
        Example(
            title="the halves rotate together (MiniCPM3)",
            before="""
                class DeepseekV3Attention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.rope_interleave = config.rope_interleave

                    def _queries(self, q_rope, cos, sin):
                        return apply_rope(q_rope, cos, sin, self.rope_interleave)
            """,
            after="""
                class DeepseekV3Attention(nn.Module):
                    def __init__(self, config, layer_idx):
                        # <-- MODEL-SPECIFIC: rotary pairs are the halves (j, j + d/2), whatever the config says
                        self.rope_interleave = False

                    def _queries(self, q_rope, cos, sin):
                        return apply_rope(q_rope, cos, sin, self.rope_interleave)
            """,
        ),
        Example(
            title="no pairing setting",
            before="""
                class LlamaAttention(nn.Module):
                    def __init__(self, config, layer_idx):
                        self.head_dim = config.head_dim
            """,
            raises="no self.rope_interleave",
        ),
    )

    def transform_module(self, module: cst.Module, ctx: FileContext) -> cst.Module:
        found = [
            node
            for node in walk(module)
            if isinstance(node, cst.SimpleStatementLine)
            and (pair := self_assignment(node)) is not None
            and pair[0] == FLAG
        ]
        if not found:
            raise ctx.precondition(f"{ID}: no self.{FLAG} = ... in this file (the reference's RoPE pairing)")
        edits: dict = {}
        for stmt in found:
            _, value = self_assignment(stmt)  # type: ignore[misc]
            if code_of(value) == "False":
                continue

            def edit(updated):
                line = updated.with_changes(
                    body=[updated.body[0].with_changes(value=cst.Name("False")), *updated.body[1:]]
                )
                return with_comment(line, COMMENT)

            edits[id(stmt)] = edit
        return rewrite(module, edits)
