"""Names a port is identified by: snake_case model name, PascalCase class prefix
and the Hugging Face architecture string."""

from __future__ import annotations

import keyword
import re

MODEL_NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")
CLASS_PREFIX_RE = re.compile(r"^[A-Z][A-Za-z0-9]*$")
ARCHITECTURE_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def model_name_problem(name: str) -> str | None:
    """Why ``name`` cannot name a port (its package directory, imported as
    ``vllm_neuron.model.<name>``), or None."""
    if not MODEL_NAME_RE.match(name):
        return f"{name!r} is not snake_case ({MODEL_NAME_RE.pattern})"
    if keyword.iskeyword(name):
        return (
            f"{name!r} is a Python keyword: the port's package vllm_neuron.model.{name} could not be "
            f"imported; choose another name (e.g. {name}_model)"
        )
    return None


def name_for_model_type(model_type: str) -> str:
    """The default model name of a checkpoint: its ``model_type`` in
    snake_case (``openai-gpt`` -> ``openai_gpt``, ``modernbert-decoder`` ->
    ``modernbert_decoder``), made a valid package name (a keyword gets
    ``_model``, a leading digit ``model_``)."""
    name = re.sub(r"[^a-z0-9]+", "_", model_type.lower()).strip("_") or "model"
    if not name[0].isalpha():
        name = f"model_{name}"
    return f"{name}_model" if keyword.iskeyword(name) else name


def derive_class_prefix(model_name: str) -> str:
    """``qwen2`` -> ``Qwen2``, ``gpt_neox`` -> ``GptNeox``, ``qwen3_moe`` -> ``Qwen3Moe``.

    The derivation is mechanical; names with conventional capitals
    (``GPTNeoX``) are given explicitly as ``class_prefix`` in the plan."""
    return "".join(part[:1].upper() + part[1:] for part in model_name.split("_") if part)
