"""The transformers side: the same checkpoint loaded with its Hugging Face
modeling code (eager attention), in float32 (the baseline) and bfloat16.

``greedy_teacher`` generates the teacher tokens greedily with the float32
model; ``run_reference`` runs each full sequence (prompt + teacher tokens) in
one causal forward and records the logits and every component's output at
every position.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from autoport_cst.config_json import load_config_values
from autoport_cst.errors import InputError

from .components import Component, ComponentRecorder, find_components


@dataclass
class ReferenceOutput:
    """Per sequence: logits ``[L, V]`` and component outputs ``[L, H]`` for
    all ``L = prompt + steps`` positions."""

    logits: list[torch.Tensor]
    components: list[Component]
    records: dict[str, list[torch.Tensor]]
    # per prompt, the input embeddings of its ids (``prompt_embeddings``), for prompt-embedding runs
    input_embeddings: list[torch.Tensor] | None = None
    # the attributes transformers read from its config objects while it loaded and ran the model
    # (the fp32 run: ``unread_fields.recording_config_reads``); None when not recorded
    config_reads: frozenset[str] | None = None


def load_reference(checkpoint_dir: str | Path, dtype: torch.dtype, attn_implementation: str = "eager") -> Any:
    """The checkpoint's own architecture class (its config's
    ``architectures``; ``AutoModelForCausalLM`` when transformers has no such
    class), refusing a checkpoint with missing or mismatched tensors
    (transformers would initialise them randomly). Attention is eager unless
    ``attn_implementation`` names another registered with transformers."""
    import transformers
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    model_class = AutoModelForCausalLM
    try:
        names = load_config_values(Path(checkpoint_dir) / "config.json").get("architectures")
    except (OSError, ValueError, AttributeError):
        names = None  # from_pretrained reports it
    if isinstance(names, list) and names and isinstance(getattr(transformers, str(names[0]), None), type):
        model_class = getattr(transformers, names[0])

    verbosity = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        # (model, loading info) with output_loading_info; transformers annotates the model alone
        loaded: Any = model_class.from_pretrained(
            str(checkpoint_dir),
            dtype=dtype,
            attn_implementation=attn_implementation,
            output_loading_info=True,
            # transformers' own code: 5.25 turns hub kernels on by default, which
            # may fetch and swap in kernels (another computation, a download)
            use_kernels=False,
        )
        model, info = loaded
    except (OSError, ValueError, RuntimeError) as error:
        mismatches = _shape_mismatches(checkpoint_dir)
        if mismatches:
            raise InputError(
                f"{checkpoint_dir}: tensor(s) with the wrong shape for transformers: " + "; ".join(mismatches)
            ) from error
        raise InputError(f"{checkpoint_dir}: transformers cannot load the checkpoint: {error}") from error
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()
    missing = list(info.get("missing_keys") or [])
    mismatched = list(info.get("mismatched_keys") or [])
    if missing:
        raise InputError(
            f"{checkpoint_dir}: the checkpoint has no tensor {', '.join(map(repr, sorted(missing)))} "
            f"that transformers' {type(model).__name__} needs"
        )
    if mismatched:
        raise InputError(f"{checkpoint_dir}: tensors with the wrong shape: {mismatched}")
    del transformers
    return model.eval()


def _shape_mismatches(checkpoint_dir: str | Path) -> list[str]:
    """Checkpoint tensors whose shape differs from the transformers model's
    (built on the meta device from the checkpoint's config)."""
    from safetensors import safe_open
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(str(checkpoint_dir))
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
    except Exception:  # noqa: BLE001 - fall back to transformers' own message
        return []
    expected = {name: list(t.shape) for name, t in model.state_dict().items()}
    found = []
    for path in sorted(Path(checkpoint_dir).glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as handle:
            for name in handle.keys():
                shape = list(handle.get_slice(name).get_shape())
                if name in expected and expected[name] != shape:
                    found.append(f"'{name}' is {shape}, expected {expected[name]}")
    return found


def greedy_teacher(model: Any, prompts: tuple[tuple[int, ...], ...], steps: int) -> list[list[int]]:
    """``steps`` greedy tokens per prompt (repeated full causal forwards)."""
    teacher: list[list[int]] = []
    with torch.no_grad():
        for prompt in prompts:
            ids = list(prompt)
            generated: list[int] = []
            for _ in range(steps):
                logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
                token = int(torch.argmax(logits))
                generated.append(token)
                ids.append(token)
            teacher.append(generated)
    return teacher


def run_reference(
    model: Any, prompts: tuple[tuple[int, ...], ...], teacher: list[list[int]]
) -> ReferenceOutput:
    components = find_components(model)
    recorder = ComponentRecorder(model, components)
    logits: list[torch.Tensor] = []
    try:
        with torch.no_grad():
            for index, (prompt, generated) in enumerate(zip(prompts, teacher, strict=False)):
                recorder.set_tag(index)
                output = model(input_ids=torch.tensor([list(prompt) + list(generated)]))
                logits.append(output.logits[0].detach().clone())
    finally:
        recorder.remove()
    records = {
        name: [tensor.reshape(-1, tensor.shape[-1]) for tensor in last_per_forward(entries)]
        for name, entries in recorder.records.items()
    }
    return ReferenceOutput(logits, components, records)


def last_per_forward(entries: list[tuple[Any, Any]]) -> list[Any]:
    """The tensors of ``(tag, tensor)`` records, one per forward (tag): the
    last. A module applied at two sites of one forward (NanoChat's
    ``model.norm``, on the token embeddings and on the last layer's output)
    is the component at its last application, the one that feeds what
    follows it in the component order (the final norm feeds the LM head)."""
    last: dict[Any, Any] = {}
    for tag, tensor in entries:
        last.pop(tag, None)
        last[tag] = tensor
    return list(last.values())


def prompt_embeddings(model: Any, prompts: tuple[tuple[int, ...], ...]) -> list[torch.Tensor]:
    """Per prompt, the rows transformers' forward computes from its ids with
    the model's input-embedding module (``[L, H]``; scaled when the module
    scales, as Gemma 3's does): what its ``inputs_embeds`` takes in their place."""
    embedding = model.get_input_embeddings()
    with torch.no_grad():
        return [embedding(torch.tensor([list(prompt)]))[0].detach().clone() for prompt in prompts]
