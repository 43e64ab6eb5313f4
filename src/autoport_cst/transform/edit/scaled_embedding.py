"""The backbone's token embedding built as a ``ScaledVocabEmbedding``: the
vocabulary-sharded embedding whose own forward multiplies its output by a
constant (Gemma's ``sqrt(hidden_size)``, MiniCPM3's ``scale_emb``), so that
the module's output is the scaled embedding as in transformers."""

from __future__ import annotations

from typing import cast

import libcst as cst

from autoport_cst.transform.anatomy.classes import class_here, require_method, self_assignments
from autoport_cst.transform.base import FileContext
from autoport_cst.transform.cst.roles import class_role
from autoport_cst.transform.cst.snippets import parse_expr, parse_statement
from autoport_cst.transform.cst.vocabulary import dotted
from autoport_cst.transform.edit.arguments import set_keyword
from autoport_cst.transform.edit.tree import rewrite

SCALED = "ScaledVocabEmbedding"
BASE = "VocabDimShardedEmbedding"

SCALED_CLASS = f'''
class {SCALED}({BASE}):
    """The vocabulary-sharded token embedding with its output multiplied by a
    constant factor, turned into a tensor of the output's dtype first (so a
    bfloat16 model multiplies by the factor rounded to bfloat16, as
    transformers does)."""

    def __init__(self, *args, embed_scale: float = 1.0, **kwargs):
        super().__init__(*args, **kwargs)
        self.embed_scale = embed_scale

    def forward(self, *args, **kwargs):
        output = super().forward(*args, **kwargs)
        return output * output.new_tensor(self.embed_scale)
'''

# the factor a Python float multiplied into the output, unrounded (XGLM, BioGPT)
FLOAT_SCALED_CLASS = f'''
class {SCALED}({BASE}):
    """The vocabulary-sharded token embedding with its output multiplied by a
    constant factor, a Python float (not rounded to the output's dtype: a
    bfloat16 model multiplies by the exact factor, as transformers does)."""

    def __init__(self, *args, embed_scale: float = 1.0, **kwargs):
        super().__init__(*args, **kwargs)
        self.embed_scale = embed_scale

    def forward(self, *args, **kwargs):
        output = super().forward(*args, **kwargs)
        return output * self.embed_scale
'''


def scaled_embedding(module: cst.Module, ctx: FileContext, scale: str, rounded: bool = True) -> cst.Module:
    """The backbone (``<Prefix>Model``) builds its one ``VocabDimShardedEmbedding``
    as a ``ScaledVocabEmbedding`` with ``embed_scale=<scale>`` (an expression
    of ``config``); the class is added before the backbone when missing,
    multiplying by the factor rounded to the output's dtype (``rounded``) or
    by the Python float."""
    backbone = class_here(module, ctx, "backbone", "<Prefix>Model backbone")
    if backbone is None:
        return module
    name = backbone.name.value
    init = require_method(module, ctx, backbone, "__init__")
    embeddings = [
        value
        for _, (_, value) in self_assignments(init).items()
        if isinstance(value, cst.Call) and (dotted(value.func) or "").split(".")[-1] in (BASE, SCALED)
    ]
    if len(embeddings) != 1:
        raise ctx.refuse(
            f"{name}.__init__ builds no {BASE}(...) token embedding, or more than one", init, module
        )
    call = embeddings[0]
    edits: dict = {}
    if dotted(call.func) != SCALED:
        edits[id(call)] = lambda updated: set_keyword(
            updated.with_changes(func=cst.Name(SCALED)), "embed_scale", parse_expr(scale, module)
        )
    module = rewrite(module, edits)
    if not any(isinstance(s, cst.ClassDef) and s.name.value == SCALED for s in module.body):
        body = list(module.body)
        index = next(
            i
            for i, s in enumerate(body)
            if isinstance(s, cst.ClassDef) and class_role(s.name.value) == "backbone"
        )
        new_class = cast(
            cst.ClassDef,
            parse_statement((SCALED_CLASS if rounded else FLOAT_SCALED_CLASS).strip("\n"), module),
        )
        anchor = body[index]
        body[index] = anchor.with_changes(
            leading_lines=[cst.EmptyLine(indent=False), cst.EmptyLine(indent=False)]
        )
        body.insert(index, new_class.with_changes(leading_lines=anchor.leading_lines))
        module = module.with_changes(body=body)
    return module
