"""Class roles in a vllm_neuron model package.

Codemods find their targets by role, not by full name, so they work on any
class prefix (``LlamaAttention``, ``Qwen2Attention``, ``GPTNeoXAttention``).
The role is read from the class-name suffix, the convention every
vllm_neuron model follows (see docs/vllm-neuron-anatomy.md, section 2).
"""

from __future__ import annotations

# Checked in order: longer, more specific suffixes first.
ROLE_SUFFIXES: tuple[tuple[str, str], ...] = (
    ("ForCausalLM", "causal_lm"),
    ("DecoderLayer", "decoder_layer"),
    ("RotaryEmbedding", "rotary"),
    ("RMSNorm", "norm"),
    ("LayerNorm", "norm"),
    ("Attention", "attention"),
    ("Experts", "experts"),
    ("SparseMoeBlock", "moe"),
    ("MoE", "moe"),
    ("MLP", "mlp"),
    ("Router", "router"),
    ("Model", "backbone"),
    ("Config", "config"),
)

ROLES = tuple(dict.fromkeys(role for _, role in ROLE_SUFFIXES))


def class_role(name: str) -> str | None:
    """The role of a class by its name, or None."""
    for suffix, role in ROLE_SUFFIXES:
        if name.endswith(suffix) and len(name) >= len(suffix):
            return role
    return None


def split_prefix(name: str) -> tuple[str, str] | None:
    """``Qwen2RMSNorm`` -> (``Qwen2``, ``RMSNorm``); None when no role suffix."""
    for suffix, _ in ROLE_SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)], suffix
    return None


def file_role(relpath: str) -> str:
    """Role of a file inside a model package, by its name."""
    name = relpath.rsplit("/", 1)[-1]
    if relpath.startswith("companions/"):
        return "companion"
    if name == "config.py":
        return "config"
    if name == "factory.py":
        return "factory"
    if name == "__init__.py":
        return "init"
    if name == "registry.py":
        return "registry"
    if name.endswith(".md"):
        return "docs"
    if name.startswith("model") and name.endswith(".py"):
        return "model"
    if name.startswith("vision_") and name.endswith(".py"):
        return "tower"  # a vision-language model's tower: its own architecture, apart from the decoder's
    if name.endswith(".py"):
        return "module"
    return "data"
