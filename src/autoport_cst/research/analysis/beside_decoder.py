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
    head = r.module_names.get("lm_head")
    # a causal LM holding its layers itself, or a head research did not find, is not judged here
    if not backbone_path or not head:
        return
    # the decoder, the head and the backbone's parts found beside the layers (embeddings, final norm)
    kept = [
        path for key, path in r.module_names.items() if path and (key == "lm_head" or key.startswith("model"))
    ]
    outside = sorted({_root(key, kept) for key in r.expected if not any(_under(key, p) for p in kept)})
    if not outside:
        return
    listed = ", ".join(f"{path} ({r.roles.get(path, 'parameter')})" for path in outside)
    st.add(
        known(
            True,  # explains no section: what else the code computes is still named
            "unsupported.modules_beside_decoder",
            CODE,
            f"{st.cls.name} holds {listed} beside its decoder ({backbone_path}) and its head ({head})",
        )
    )


def _root(key: str, kept: list[str]) -> str:
    """The outermost module holding ``key`` that holds nothing kept (the key
    itself when its module also holds the decoder)."""
    parts = key.split(".")
    for end in range(1, len(parts)):
        prefix = ".".join(parts[:end])
        if not any(_under(path, prefix) for path in kept):
            return prefix
    return key


def _under(key: str, path: str) -> bool:
    return key == path or key.startswith(path + ".")
