"""Modules with parameters that a causal LM holds beside its text decoder
and its LM head, named from its module tree. A port holds the decoder and
the head only, so such a module would be dropped without a word: Fuyu's
``model.vision_embed_tokens`` (a linear layer from image patches into the
embeddings' space, which its forward scatters among the token embeddings)
is what the image inputs go through. The model is refused by that module,
not ported as the text model it wraps."""

from __future__ import annotations

from autoport_cst.research.analysis.state import AnalyzerState
from autoport_cst.research.findings import CODE, known


def modules_beside_decoder(st: AnalyzerState, backbone_path: str) -> None:
    """Name the modules whose parameters lie outside ``backbone_path`` (the
    module holding the decoder layers) and the LM head."""
    r = st.result
    if not backbone_path:  # the causal LM holds its layers itself
        return
    head = r.module_names.get("lm_head")
    kept = [backbone_path, *([head] if head else [])]
    outside = sorted({key.rsplit(".", 1)[0] for key in r.expected if not any(_under(key, p) for p in kept)})
    if not outside:
        return
    listed = ", ".join(f"{path} ({r.roles.get(path, 'module')})" for path in outside)
    st.add(
        known(
            ("embedding",),
            "unsupported.modules_beside_decoder",
            CODE,
            f"{st.cls.name} holds {listed} beside its decoder ({backbone_path}) and its head ({head})",
        )
    )


def _under(key: str, path: str) -> bool:
    return key == path or key.startswith(path + ".")
