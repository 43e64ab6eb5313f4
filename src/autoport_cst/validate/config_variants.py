"""The config variants a port's reference declares it supports, as checkpoints to validate on.

A reference reads some features from the config at run time (``config_driven``
in its ``reference.json``: the RoPE type, tied embeddings, a sliding window, the
checkpoint's expert layout...), so a port of it claims every declared value,
not only the one of the checkpoint at hand. :func:`declared_variants` turns
each declared value the checkpoint's architecture can express, and that the
checkpoint does not already have, into a config (and key format) to build a
random checkpoint of (``variants.build_variant_checkpoint``).

Variant parameters are picked so that each one matters on the tiny sizes: the
Llama 3 wavelengths bands and the YaRN correction band are placed from the
checkpoint's own RoPE dimensions so that every band holds a frequency, and
YaRN runs twice, with its band edges rounded (``truncate``, the default) and
without, where ``beta_fast`` and ``beta_slow`` move the band continuously.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# A window shorter than the default prompts (8, 12, 20 tokens), so that it masks
SLIDING_WINDOW = 6


@dataclass(frozen=True)
class ConfigVariant:
    """One declared variant: the config.json values and key format of its
    checkpoint, or why the checkpoint's architecture cannot express it."""

    label: str
    values: dict[str, Any] | None
    key_format: str = "model"
    skipped: str | None = None
    # the expert layout (checkpoint.gate_up) the checkpoint must have, checked once written
    layout: str | None = None


def declared(package_dir: str | Path) -> dict[str, Any]:
    """The ``config_driven`` declaration of a port package (``{}`` without one)."""
    path = Path(package_dir) / "reference.json"
    if not path.is_file():
        return {}
    manifest = json.loads(path.read_text(encoding="utf-8"))
    found = manifest.get("config_driven") if isinstance(manifest, dict) else None
    return found if isinstance(found, dict) else {}


def declared_variants(
    package_dir: str | Path, base: dict[str, Any], key_format: str, layout: str | None = None
) -> list[ConfigVariant]:
    """A variant per declared (feature, value) the checkpoint of ``base``
    (written in ``key_format``; its experts stored as ``layout`` says, when
    read from its names) does not already have."""
    variants: list[ConfigVariant] = []
    planned = layout or _planned_layout(package_dir)
    for feature, values in declared(package_dir).items():
        if not isinstance(values, list):
            continue  # "*": any value, nothing to enumerate
        for value in values:
            if feature == "checkpoint.gate_up":
                variants.extend(_layout_variant(value, base, key_format, planned))
            else:
                variants.extend(_variants_of(feature, value, base, key_format))
    return variants


def _planned_layout(package_dir: str | Path) -> str | None:
    """The expert layout (``checkpoint.gate_up``) of the port's own spec."""
    path = Path(package_dir) / "reference.json"
    manifest = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
    spec = manifest.get("spec") if isinstance(manifest, dict) else None
    checkpoint = spec.get("checkpoint") if isinstance(spec, dict) else None
    found = checkpoint.get("gate_up") if isinstance(checkpoint, dict) else None
    return found if isinstance(found, str) else None


def _layout_variant(
    value: Any, base: dict[str, Any], key_format: str, planned: str | None
) -> list[ConfigVariant]:
    """The other expert layout than the checkpoint's (read from its names;
    without them the port's spec says which it has, else the key format:
    ``save_pretrained`` splits the experts most architectures stack): a
    checkpoint in the other key format, whose layout is checked once written
    (some architectures stack theirs in both). A port planned on per-expert
    hub keys and validated on a checkpoint that stacks them runs the
    per-expert one too."""
    if value == (planned or ("separate" if key_format == "saved" else "fused")):
        return []
    other = "model" if key_format == "saved" else "saved"
    return [ConfigVariant(f"checkpoint.gate_up={json.dumps(value)}", base, other, layout=value)]


def _variants_of(feature: str, value: Any, base: dict[str, Any], key_format: str) -> list[ConfigVariant]:
    label = f"{feature}={json.dumps(value)}"
    edits = _edits(feature, value, base)
    if edits is None:
        return [ConfigVariant(label, None, skipped="no config edit of this architecture realises it")]
    # written as the checkpoint is (hub names or the model's): only the feature differs
    return [ConfigVariant(f"{label}{suffix}", {**base, **edit}, key_format) for suffix, edit in edits]


def _edits(feature: str, value: Any, base: dict[str, Any]) -> list[tuple[str, dict]] | None:
    """The config edits of one declared value (``[]`` when the base already
    has it), each with a label suffix; None when none realises it."""
    rope = base.get("rope_parameters")
    if feature == "rope.type":
        if not isinstance(rope, dict) or "rope_theta" not in rope:
            return None
        if rope.get("rope_type", "default") == value:
            return []
        return _kept_temperature(_rope_edits(value, rope, _rope_dims(base)), rope)
    if feature == "embedding.tied":
        return (
            [] if bool(base.get("tie_word_embeddings")) == value else [("", {"tie_word_embeddings": value})]
        )
    if feature == "moe.norm_topk_prob":
        if "norm_topk_prob" not in base:
            return None
        return [] if base["norm_topk_prob"] == value else [("", {"norm_topk_prob": value})]
    if feature == "attention.sliding_window":
        return _window_edits(value, base)
    return None


# entries of rope_parameters the attention temperature reads (Ministral 3),
# not the RoPE's: a variant of the RoPE type keeps them
_TEMPERATURE_ENTRIES = ("llama_4_scaling_beta", "original_max_position_embeddings")


def _kept_temperature(
    edits: list[tuple[str, dict]] | None, rope: dict[str, Any]
) -> list[tuple[str, dict]] | None:
    """``edits`` whose rope_parameters keep the attention temperature's entries
    of ``rope`` (those a variant does not set itself)."""
    if edits is None or rope.get("llama_4_scaling_beta") is None:
        return edits
    kept = {k: rope[k] for k in _TEMPERATURE_ENTRIES if k in rope}
    return [
        (suffix, {**edit, "rope_parameters": {**kept, **edit["rope_parameters"]}}) for suffix, edit in edits
    ]


def _rope_dims(base: dict[str, Any]) -> int:
    head_dim = base.get("head_dim") or base["hidden_size"] // base["num_attention_heads"]
    factor = (base.get("rope_parameters") or {}).get("partial_rotary_factor") or base.get(
        "partial_rotary_factor", 1.0
    )
    return int(head_dim * factor)


def _rope_edits(value: Any, rope: dict[str, Any], dims: int) -> list[tuple[str, dict]] | None:
    theta = float(rope["rope_theta"])
    if value == "default":
        return [("", {"rope_parameters": {"rope_type": "default", "rope_theta": theta}})]
    if value == "llama3":
        return [("", {"rope_parameters": {"rope_theta": theta, **llama3_parameters(theta, dims)}})]
    if value == "yarn":
        yarn = {"rope_theta": theta, **yarn_parameters(theta, dims)}
        # the context YaRN extends to: the factor times the original one
        longest = {"max_position_embeddings": int(yarn["factor"] * yarn["original_max_position_embeddings"])}
        return [
            ("", {"rope_parameters": yarn, **longest}),
            (" (not truncated)", {"rope_parameters": {**yarn, "truncate": False}, **longest}),
        ]
    return None


def llama3_parameters(theta: float, dims: int) -> dict[str, Any]:
    """Llama 3 scaling whose three wavelength bands (kept, smoothed, divided
    by ``factor``) each hold a frequency of the ``dims`` rotated dimensions:
    the original context sits between the second and third shortest
    wavelengths (short, so that it stays under the tiny context)."""
    wavelengths = sorted(2 * math.pi * theta ** (2 * i / dims) for i in range(dims // 2))
    if len(wavelengths) >= 3:
        original = math.sqrt(wavelengths[1] * wavelengths[2])
    elif len(wavelengths) == 2:  # partial rotary: the longer one divided, the shorter kept or smoothed
        original = math.sqrt(wavelengths[0] * wavelengths[1])
    else:  # one frequency: divided
        original = 2 * wavelengths[0]
    return {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": max(1, round(original)),
    }


def yarn_parameters(theta: float, dims: int) -> dict[str, Any]:
    """YaRN scaling whose correction band (from ``beta_fast`` and
    ``beta_slow``, left at their defaults 32 and 1) lies strictly inside the
    ``dims / 2`` frequencies, with edges between whole dimensions, so the
    defaults, the rounding and the ramp all matter."""
    per_log = dims / (2 * math.log(theta))  # dimensions per unit of log wavelength
    width = per_log * math.log(32.0)  # the band's width before rounding
    low = max(0.25, min(1.5, (dims / 2 - 1 - width) / 2))
    low = math.floor(low) + 0.5 if low >= 1 else low
    original = 2 * math.pi * 32.0 * math.exp(low / per_log)
    return {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": max(1, round(original))}


def _window_edits(value: Any, base: dict[str, Any]) -> list[tuple[str, dict]] | None:
    if "sliding_window" not in base:
        return None  # the architecture has no window to set
    layers = int(base["num_hidden_layers"])
    kinds = base.get("layer_types")
    if value == "none":
        if kinds is not None:  # every layer full; the window stays, unused (some models always read it)
            full = ["full_attention"] * layers
            return [] if kinds == full else [("", {"layer_types": full})]
        if base.get("sliding_window") is None:
            return []
        return [("", {"sliding_window": None, "use_sliding_window": False})]
    window = {"sliding_window": SLIDING_WINDOW}
    if "use_sliding_window" in base:
        window = {**window, "use_sliding_window": True, "max_window_layers": layers}
    if value == "all":
        return (
            [("", window)]
            if kinds is None
            else [("", {**window, "layer_types": ["sliding_attention"] * layers})]
        )
    if value == "per_layer":
        if kinds is None:
            return None
        mixed = ["sliding_attention"] * (layers - 1) + ["full_attention"]
        return (
            [] if kinds == mixed and base.get("sliding_window") else [("", {**window, "layer_types": mixed})]
        )
    return None


def check_config_variants(
    report: Any, package_dir: str | Path, checkpoint_dir: str | Path, validate: Any
) -> None:
    """Validate the port on a checkpoint of each declared variant
    (``validate(checkpoint) -> ValidationReport``), into ``report``: each in
    ``report.config_variants``; the first that fails makes the report fail,
    named after it."""
    import tempfile

    from .tiny import key_format_of
    from .variants import build_variant_checkpoint, read_values

    base = read_values(checkpoint_dir)
    with tempfile.TemporaryDirectory(prefix="autoport-variant-") as scratch:
        layout = expert_layout(checkpoint_dir) if "checkpoint.gate_up" in declared(package_dir) else None
        variants = declared_variants(package_dir, base, key_format_of(checkpoint_dir), layout)
        for index, variant in enumerate(variants):
            entry: dict[str, Any] = {"label": variant.label, "equivalent": None, "summary": variant.skipped}
            report.config_variants.append(entry)
            if variant.values is None:
                continue
            try:
                directory = build_variant_checkpoint(
                    variant.values, Path(scratch) / str(index), key_format=variant.key_format
                )
            except Exception as error:  # noqa: BLE001 - transformers' config class refuses the variant
                entry["summary"] = f"not run: transformers cannot build it: {type(error).__name__}: {error}"
                continue
            written = expert_layout(directory) if variant.layout is not None else None
            if written != variant.layout:
                entry["summary"] = (
                    f"not run: transformers writes no {variant.layout} experts for this architecture "
                    f"(its {variant.key_format} key format stores them {written} too)"
                )
                continue
            try:
                found = validate(directory)
            except Exception as error:
                if not raised_in_transformers(error):
                    raise
                entry["summary"] = f"not run: the transformers run fails: {type(error).__name__}: {error}"
                continue
            entry.update(equivalent=found.equivalent, summary=found.summary())
            if found.equivalent or not report.equivalent:
                continue
            report.fail_as(f"config variant {variant.label}", found)


def expert_layout(directory: str | Path) -> str:
    """How a checkpoint stores its routed experts: ``separate`` (a tensor
    per expert, ``...experts.<j>...``) or ``fused``."""
    from autoport_cst.research.checkpoint import read_checkpoint

    header = read_checkpoint(directory)
    names = header.tensors if header is not None else {}
    return "separate" if any(re.search(r"\.experts\.\d+\.", name) for name in names) else "fused"


def raised_in_transformers(error: BaseException) -> bool:
    """Whether ``error`` was raised inside transformers (the architecture
    cannot run the variant); anything else is the validator's to report."""
    import traceback

    import transformers

    root = str(Path(transformers.__file__).parent)
    frames = traceback.extract_tb(error.__traceback__)
    return bool(frames) and frames[-1].filename.startswith(root)
