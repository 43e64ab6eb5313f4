"""Checkpoint key names: the renames from the Llama-style module paths the
references load to the module paths a model's code builds (and its
checkpoint stores), as ``checkpoint.key_map``.

Canonical names: ``model`` (the backbone), ``model.layers``,
``model.embed_tokens``, ``model.norm`` (final norm), ``lm_head``; inside a
decoder layer ``self_attn`` with ``q_proj``, ``k_proj``, ``v_proj`` (or one
fused ``qkv_proj``), ``o_proj``, ``q_norm``, ``k_norm``; ``mlp`` with
``gate_proj``, ``up_proj`` (or ``gate_up_proj``), ``down_proj``; the norms
``input_layernorm``, ``post_attention_layernorm`` (before the MLP in a
pre-norm layer, on the attention output in post and sandwich layers),
``pre_feedforward_layernorm`` and ``post_feedforward_layernorm``.

A rename maps whole dotted segments (``self_attn.o_proj`` ->
``attention.dense``), longest pattern first, left to right, without chaining
(so ``{a: b, b: c}`` swaps names correctly); the ``checkpoint-keys`` codemod
applies the same rule.
"""

from __future__ import annotations

# canonical containers and the canonical children they hold
TOP_LEVEL = (
    "model",
    "model.layers",
    "model.embed_tokens",
    "model.embed_positions",
    "model.embed_norm",
    "model.norm",
    "lm_head",
)
CONTAINERS = ("self_attn", "mlp")


def rename(text: str, renames: dict[str, str]) -> str:
    """Apply segment renames to one dotted key."""
    rules = sorted(
        ((old.split("."), new.split(".")) for old, new in renames.items()), key=lambda r: -len(r[0])
    )
    segments = text.split(".")
    out: list[str] = []
    i = 0
    while i < len(segments):
        for old, new in rules:
            if segments[i : i + len(old)] == old:
                out += new
                i += len(old)
                break
        else:
            out.append(segments[i])
            i += 1
    return ".".join(out)


def derive_key_map(names: dict[str, str]) -> dict[str, str] | None:
    """The fewest segment renames that turn every canonical path of
    ``names`` (canonical -> the code's path) into the code's path; None when
    none is needed. Parents come before children, so a renamed container
    (``self_attn`` -> ``attention``) covers its children unless a child's
    own name differs too."""
    renames: dict[str, str] = {}

    def order(path: str) -> tuple:
        return (path.count("."), path)

    for canonical in sorted(names, key=order):
        actual = names[canonical]
        if not actual:
            continue
        if rename(canonical, renames) != actual:
            renames[canonical] = actual
    return renames or None


def canonical_keys(names: dict[str, str], layer: int = 0) -> list[str]:
    """Canonical module paths of leaf modules, as full paths of layer ``layer``."""
    out = []
    for canonical in names:
        if canonical in ("model", "model.layers") or canonical in CONTAINERS:
            continue
        out.append(canonical if canonical in TOP_LEVEL else f"model.layers.{layer}.{canonical}")
    return out
