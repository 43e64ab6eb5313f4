"""The FP8 KV-cache run a default validation goes on to.

A port that reads KV-cache scales (``k_scale`` / ``v_scale`` per attention, for
an FP8 cache) claims every FP8 checkpoint of its architecture, but the tiny
validation checkpoints carry no scales, and the plain run keeps a
``bfloat16``/``float32`` cache: the scale code never runs, and a port that
swaps or ignores them validates. So a passing plain validation goes on to a
copy of its checkpoint with distinct dequantization scales per layer and per
tensor (``k_scale`` and ``v_scale`` beside each attention's projections, where
an FP8 checkpoint stores them), run with ``kv_cache_dtype="fp8"`` against the
transformers run with the same FP8 cache (``fp8_reference``), teacher-forced
from the port's stored K/V where the two round a value at an FP8 rounding
boundary apart (``fp8_cache_forcing``): one run, on the validation's prompts,
at the fp32 bound.

It runs only for a port whose code reads ``k_scale`` (a port without it has no
FP8 cache scales to check: a latent-attention cache, say), and it is reported
as not run when the checkpoint names no attention module under its decoder
layers or the port refuses an FP8 cache by its own ``NotImplementedError``.
Each layer's attention module is read off the checkpoint's tensor names (the
module, named with "att", holding weights under an indexed layer of the
decoder's layer list: ``model.layers.<i>.self_attn``, ``gpt_neox.layers.<i>.
attention``, ``transformer.h.<i>.attn``), where an FP8 checkpoint of that
architecture stores the scales, not where the port reads them (a port reading
them under another name must fail). Its entry is one of
``report.config_variants`` (a checkpoint of its own, at TP=1 in fp32).
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

LABEL = "kv_cache_dtype=fp8 (distinct k_scale and v_scale per layer)"


def layer_scales(layer: int) -> tuple[float, float]:
    """The dequantization scales ``(k_scale, v_scale)`` of a layer: powers of
    two, so that a port folding them into the softmax scale and the output
    projection (as the references do) computes exactly what transformers'
    scaled cache does, to fp32 rounding; above 1, so that the cache holds
    ``x / s`` with the coarser FP8 steps of small values, which a port that
    ignores a scale does not reproduce (below 1, a power of two would only
    move the exponent); unequal within a layer and from one layer to the next,
    so a swapped pair or another layer's pair stores K or V at another scale
    than the read undoes."""
    return _K_SCALES[layer % 4], _V_SCALES[layer % 4]


_K_SCALES = (2.0, 8.0, 4.0, 16.0)
_V_SCALES = (4.0, 2.0, 16.0, 8.0)
# a weight of a module inside an attention module under an indexed layer of a layer list (the
# attention's name holds "att": self_attn, attention, attn, self_attention; post_attention_layernorm
# .weight is no such weight): (layer list, index, attention module); of an attention inside another
# (GPT-Neo's attn.attention, a pass-through wrapper), the inner one, which holds the projections
_ATTENTION_WEIGHT = re.compile(
    r"^(.*?)\.(\d+)\.([^.]*att[^.]*(?:\.[^.]*att[^.]*)*)\.(?:[^.]+\.)+weight$", re.IGNORECASE
)


def reads_kv_scales(package_dir: str | Path) -> bool:
    """Whether the port's code reads KV-cache scales (``k_scale``)."""
    return any("k_scale" in path.read_text(encoding="utf-8") for path in Path(package_dir).glob("*.py"))


def attention_modules(checkpoint_dir: str | Path) -> dict[int, str]:
    """Each decoder layer's attention module path, from the checkpoint's
    tensor names: of the layer lists holding attention modules, the one
    indexed by exactly the config's decoder layers (a vision tower's blocks
    are another list), else the one with the most layers."""
    from autoport_cst.research.checkpoint import read_checkpoint

    header = read_checkpoint(checkpoint_dir)
    lists: dict[str, dict[int, str]] = {}
    for name in sorted(header.tensors if header is not None else ()):
        match = _ATTENTION_WEIGHT.match(name)
        if match:
            lists.setdefault(match[1], {}).setdefault(int(match[2]), f"{match[1]}.{match[2]}.{match[3]}")
    if not lists:
        return {}
    layers = set(range(_decoder_layers(checkpoint_dir)))
    return max(lists.values(), key=lambda found: (set(found) == layers, len(found)))


def _decoder_layers(checkpoint_dir: str | Path) -> int:
    """The decoder's layer count (``num_hidden_layers`` / ``n_layer``, of the
    text config when it has one; 0 when it names none)."""
    from autoport_cst.config_json import load_config_values

    try:
        config = load_config_values(Path(checkpoint_dir) / "config.json")
    except (OSError, ValueError):
        return 0
    if not isinstance(config, dict):
        return 0
    text = config.get("text_config")
    config = text if isinstance(text, dict) else config
    count = next((config[k] for k in ("num_hidden_layers", "n_layer", "num_layers") if k in config), 0)
    return count if isinstance(count, int) else 0


def scaled_checkpoint(checkpoint_dir: str | Path, target: str | Path, modules: dict[int, str]) -> Path:
    """A copy of the checkpoint with ``<attention>.k_scale`` and ``.v_scale``
    of every layer added (``[1]`` tensors, distinct)."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    target = Path(target)
    shutil.copytree(checkpoint_dir, target)
    files = sorted(target.glob("*.safetensors"))
    path = files[0]
    with safe_open(str(path), framework="pt") as handle:
        metadata = handle.metadata()
    state = load_file(str(path))
    for layer, module in modules.items():
        k_scale, v_scale = layer_scales(layer)
        state[f"{module}.k_scale"] = torch.tensor([k_scale])
        state[f"{module}.v_scale"] = torch.tensor([v_scale])
    save_file(state, str(path), metadata=metadata)
    _index_scales(target, path.name, modules)
    return target


def _index_scales(target: Path, filename: str, modules: dict[int, str]) -> None:
    """Name the added tensors in a sharded checkpoint's index, when it has one."""
    import json

    index = target / "model.safetensors.index.json"
    if not index.is_file():
        return
    data = json.loads(index.read_text(encoding="utf-8"))
    for module in modules.values():
        for name in ("k_scale", "v_scale"):
            data.setdefault("weight_map", {})[f"{module}.{name}"] = filename
    index.write_text(json.dumps(data, indent=2), encoding="utf-8")


def check_kv_scale_variant(
    report: Any, package_dir: str | Path, checkpoint_dir: str | Path, validate: Callable[..., Any], seed: int
) -> None:
    """Validate the port with an FP8 KV cache on a scaled copy of its
    checkpoint (``validate(checkpoint, seed=...) -> ValidationReport``, fp8
    cache), into ``report.config_variants``; a failure fails ``report``,
    named after it.

    One run at the fp32 bound: the transformers run's cache is teacher-forced
    from the port's stored K/V where the two round a value at an FP8
    rounding boundary apart (``fp8_cache_forcing``), so a correct port passes
    on any prompts and one that misuses a scale fails."""
    import tempfile

    if not reads_kv_scales(package_dir):
        return
    entry: dict[str, Any] = {"label": LABEL, "equivalent": None, "summary": None}
    report.config_variants.append(entry)
    modules = attention_modules(checkpoint_dir)
    if not modules:
        entry["summary"] = "not run: the checkpoint names no attention module under its layers"
        return
    from autoport_cst.errors import InputError

    with tempfile.TemporaryDirectory(prefix="autoport-kv-scales-") as scratch:
        scaled = scaled_checkpoint(checkpoint_dir, Path(scratch) / "scaled", modules)
        try:
            found = validate(scaled, seed=seed)
        except InputError as refused:  # the validator cannot run an FP8 cache on this checkpoint
            entry["summary"] = f"not run: {str(refused).strip().splitlines()[0]}"
            return
    if found.failure is not None and found.failure.refusal:
        entry["summary"] = f"not run: the port refuses it ({found.failure.stage}: {found.failure.message})"
        return
    entry.update(equivalent=found.equivalent, summary=found.summary())
    if not found.equivalent and report.equivalent:
        report.fail_as(f"config variant {LABEL}", found)
