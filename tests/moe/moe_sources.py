"""Model sources for the property tests of the mixture-of-experts codemods.

The generated sources of ``tests/codemods/model_sources.py`` have no experts
class in the reference's shape, so the MoE codemods refuse them. These
sources are the qwen3_moe reference's own classes (norm, attention, experts,
and the causal LM's ``load_weights``), cut down to what the codemods read,
under a drawn class prefix, with or without the fused decode kernel and the
QK-norm.
"""

from __future__ import annotations

from functools import cache

import libcst as cst
from hypothesis import strategies as st

from .conftest import QWEN3_MOE

KEPT_CLASSES = ("RMSNorm", "Attention", "Experts", "ForCausalLM")
KEPT_CAUSAL_LM_METHODS = ("__init__", "load_weights")
PREFIXES = st.sampled_from(["Qwen3Moe", "Mixtral", "Dots1", "Moe"])


@cache
def reference_source() -> str:
    return (QWEN3_MOE / "model.py").read_text(encoding="utf-8")


@cache
def reduced_source() -> str:
    """Imports, module-level functions and the kept classes of the reference."""
    module = cst.parse_module(reference_source())
    body = []
    for stmt in module.body:
        if isinstance(stmt, cst.ClassDef):
            if not stmt.name.value.endswith(KEPT_CLASSES):
                continue
            if stmt.name.value.endswith("ForCausalLM"):
                methods = [
                    s
                    for s in stmt.body.body
                    if not isinstance(s, cst.FunctionDef) or s.name.value in KEPT_CAUSAL_LM_METHODS
                ]
                stmt = stmt.with_changes(body=stmt.body.with_changes(body=methods))
        body.append(stmt)
    return module.with_changes(body=body).code


def with_prefix(source: str, prefix: str) -> str:
    return source.replace("Qwen3Moe", prefix)


@st.composite
def moe_sources(draw) -> tuple[str, str]:
    """(prefix, source)"""
    prefix = draw(PREFIXES)
    return prefix, with_prefix(reduced_source(), prefix)
