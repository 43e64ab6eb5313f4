"""Chunked attention: layers whose tokens attend only to the earlier tokens
of their own chunk of ``attention_chunk_size`` positions (Llama 4's RoPE
layers). The backbone builds that mask itself, with transformers'
``create_chunked_causal_mask``, and hands it to the layers whose
``config.layer_types`` entry is the mapping's key for it; the attention
then reads a mask, not a window the kernels could take.

When that key is ``"chunked_attention"`` (what a port reads from
``config.layer_types``) the spec says ``attention.chunked = "per_layer"``
with the chunk length (``attention.chunk_size``), naming the layers, the
field and where the mask is built. A chunked mask keyed by another layer
type, or handed to layers research cannot name, stays refused
(``unsupported.chunked_attention``) instead of ported as if every layer saw
the whole context (wrong past the first chunk, invisible on short
prompts)."""

from __future__ import annotations

import ast
from typing import Any

from autoport_cst.research.analysis.graph import ranges
from autoport_cst.research.analysis.state import AnalyzerState
from autoport_cst.research.findings import CODE, known
from autoport_cst.research.interp.values import Instance, SourceClass

CHUNKED_MASK = "create_chunked_causal_mask"
CHUNK_FIELD = "attention_chunk_size"
CHUNKED_TYPE = "chunked_attention"  # the layer type a port reads from config.layer_types


def _calls_chunked_mask(node: ast.AST) -> ast.Call | None:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call):
            func = sub.func
            name = (
                func.id
                if isinstance(func, ast.Name)
                else func.attr
                if isinstance(func, ast.Attribute)
                else ""
            )
            if name == CHUNKED_MASK:
                return sub
    return None


def _layer_type_key(forward: ast.AST, call: ast.Call) -> str | None:
    """The key of the mask mapping ({layer type: mask}) whose value builds the chunked mask."""
    for node in ast.walk(forward):
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if isinstance(key, ast.Constant) and isinstance(key.value, str) and value is not None:
                    if any(sub is call for sub in ast.walk(value)):
                        return key.value
    return None


def analyze(st: AnalyzerState, backbone: Instance) -> None:
    """Refuse a backbone that builds a chunked mask for some of its layers
    (when the config sets a chunk size)."""
    if not isinstance(backbone.cls, SourceClass):
        return
    found = st.interp.find_method(backbone.cls, "forward")
    if found is None:
        return
    owner, forward = found
    call = _calls_chunked_mask(forward)
    chunk: Any = st.interp.config.read(CHUNK_FIELD, None)
    if call is None or not isinstance(chunk, int) or isinstance(chunk, bool):
        return
    key = _layer_type_key(forward, call)
    types = st.interp.config.read("layer_types", None)
    layers = (
        [i for i, t in enumerate(types) if t == key] if key and isinstance(types, (list, tuple)) else None
    )
    if layers == []:
        return  # layer_types marks no layer chunked: every layer attends to its whole context
    on = f"layers {ranges(layers)} (layer_types {key!r})" if layers is not None else "some layers"
    evidence = (
        f"{owner.name}.forward ({owner.module.path.name}:{call.lineno}): {on} attend only within chunks "
        f"of {CHUNK_FIELD} = {chunk} tokens ({CHUNKED_MASK})"
    )
    if key == CHUNKED_TYPE and layers:
        st.add(known("per_layer", "attention.chunked", CODE, evidence))
        st.add(known(chunk, "attention.chunk_size", CODE, f"config {CHUNK_FIELD} = {chunk}"))
        return
    st.add(
        known(
            True,
            "unsupported.chunked_attention",
            CODE,
            f"{evidence}; a port that ignores it is wrong past the first chunk (the port reads the layers "
            f"config.layer_types marks {CHUNKED_TYPE!r})",
        )
    )
