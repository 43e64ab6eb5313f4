"""Names a port is identified by: snake_case model name, PascalCase class prefix
and the Hugging Face architecture string."""

from __future__ import annotations

import re

MODEL_NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")
CLASS_PREFIX_RE = re.compile(r"^[A-Z][A-Za-z0-9]*$")
ARCHITECTURE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def derive_class_prefix(model_name: str) -> str:
    """``qwen2`` -> ``Qwen2``, ``gpt_neox`` -> ``GptNeox``, ``qwen3_moe`` -> ``Qwen3Moe``.

    The derivation is mechanical; names with conventional capitals
    (``GPTNeoX``) are given explicitly as ``class_prefix`` in the plan."""
    return "".join(part[:1].upper() + part[1:] for part in model_name.split("_") if part)
