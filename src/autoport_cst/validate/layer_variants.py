"""The per-layer variants a config expresses, and how many layers a tiny
model needs so that each of them is instantiated at least once.

A config can make its decoder layers differ: sliding or full attention
(``layer_types``), RoPE or NoPE (``no_rope_layers``), dense or MoE MLPs
(``first_k_dense_replace``, ``mlp_only_layers``, ``decoder_sparse_step``,
``mlp_layer_types``), attention or recurrent blocks, per-layer RoPE
parameters chosen by layer type... Rather than knowing those field names,
the variants are read from what transformers builds: the model is
instantiated on the meta device (nothing allocated) with the config's own
layer count, and each decoder layer gets a fingerprint:

- for every submodule of the layer, its class, the shapes of its own
  parameters and its plain attributes (bool, int, float, str, None: e.g.
  ``is_sliding``, ``sliding_window``, ``use_rope``, ``attention_type``);
- the layer's entry of every config list with one entry per layer.

A layer's fingerprint keeps only what tells layers apart: values that are
the same on every layer (sizes, constants derived from the depth) say
nothing about variants, and attributes that only number the layers are left
out (equal to the layer's index, or different on every layer that has them:
``layer_idx`` of the attention layers of a hybrid model; or equal to the
depth where present). The variants are
the distinct fingerprints. The tiny layer count is the smallest (at least
``minimum``) at which the model built with that many layers (per-layer
lists cut to it, as ``shrink_config`` does) holds every variant of the
full-depth model; the full depth always does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_PLAIN = (bool, int, float, str, type(None))
_INTERNAL_ATTRIBUTES = frozenset({"training"})

NEAR_DEPTHS = 4  # depths above the minimum always built and checked
Fingerprint = tuple[tuple[str, str | None], ...]
ShrinkTo = Callable[[int], Any]  # a layer count -> the shrunk config with that many layers


def _decoder_layers(model: Any, count: int) -> list[Any] | None:
    """The model's decoder layers: the ModuleList holding ``count`` modules
    (the largest one if several do)."""
    import torch

    found = [
        module
        for _name, module in model.named_modules()
        if isinstance(module, torch.nn.ModuleList) and len(module) == count
    ]
    if not found:
        return None
    return list(max(found, key=_module_count))


def _module_count(module: Any) -> int:
    return sum(1 for _ in module.modules())


def _layer_facts(layer: Any, index: int, config: Any, count: int) -> dict[tuple[str, str], str]:
    """Everything a layer's fingerprint may hold, keyed by (place, name)."""
    facts: dict[tuple[str, str], str] = {}
    for path, module in layer.named_modules():
        facts[(path, "class")] = type(module).__name__
        for name, parameter in module.named_parameters(recurse=False):
            facts[(path, f"parameter {name}")] = repr(tuple(parameter.shape))
        for name, value in vars(module).items():
            if name.startswith("_") or name in _INTERNAL_ATTRIBUTES or not isinstance(value, _PLAIN):
                continue
            facts[(path, name)] = repr(value)
    for name, value in vars(config).items():
        if isinstance(value, (list, tuple)) and len(value) == count:
            facts[("config", name)] = repr(value[index])
    return facts


def _distinguishing(per_layer: list[dict[tuple[str, str], str]]) -> set[tuple[str, str]]:
    """The keys that tell layers apart: those whose value is not the same on
    every layer, except attributes that only number the layers (equal to the
    layer's index, or different on every layer that has them, or equal to
    the depth on every layer that has them). A value that
    is the same on every layer (a size, or a constant derived from the
    depth) says nothing about variants."""
    keys = set().union(*per_layer) if per_layer else set()
    kept = set()
    for key in keys:
        present = [(index, facts[key]) for index, facts in enumerate(per_layer) if key in facts]
        if len(present) == len(per_layer) and len({value for _index, value in present}) == 1:
            continue
        if key[1] != "class" and not key[1].startswith("parameter ") and _numbers(present, len(per_layer)):
            continue
        kept.add(key)
    return kept


def _numbers(present: list[tuple[int, str]], depth: int) -> bool:
    """Whether an attribute's values number the layers that have it (or
    count them: the depth copied into some layers' modules)."""
    values = [value for _index, value in present]
    if all(value == repr(depth) for value in values):
        return True
    if len(present) >= 2 and all(value == repr(index) for index, value in present):
        return True
    return len(present) >= 3 and len(set(values)) == len(values)


def layer_facts(model_class: Any, config: Any, count: int) -> list[dict[tuple[str, str], str]] | None:
    """Per decoder layer, its facts (``_layer_facts``) in the model built
    from ``config`` on the meta device; None when the layers are not found."""
    import torch

    with torch.device("meta"):
        model = model_class(config)
    layers = _decoder_layers(model, count)
    if layers is None:
        return None
    return [_layer_facts(layer, index, config, count) for index, layer in enumerate(layers)]


def fingerprints(per_layer: list[dict], keys: set[tuple[str, str]]) -> list[Fingerprint]:
    """Each layer's values of ``keys`` (None where it has no such key)."""
    ordered = sorted(keys)
    return [tuple((repr(key), facts.get(key)) for key in ordered) for facts in per_layer]


def layer_count_for_variants(
    model_class: Any, config: Any, shrink_to: ShrinkTo, minimum: int = 2
) -> tuple[int, int]:
    """``(layers, variants)``: the smallest layer count (at least
    ``minimum``) whose model holds every per-layer variant of ``config``'s
    full depth, and how many variants there are. ``shrink_to(n)`` gives the
    config shrunk to ``n`` layers."""
    depth = getattr(config, "num_hidden_layers", None)
    if not isinstance(depth, int) or depth <= minimum:
        return minimum, 1
    try:
        full = layer_facts(model_class, shrink_to(depth), depth)
    except Exception:  # noqa: BLE001 - transformers' model code: the tiny build reports it
        return minimum, 1
    if full is None:
        return minimum, 1
    if not _follows_count(model_class, shrink_to, minimum):
        return minimum, 1
    keys = _distinguishing(full)
    prints = fingerprints(full, keys)
    variants = set(prints)
    count = minimum
    while count < depth:
        # the depths right above the minimum are tried (a variant may sit on
        # the last layer), deeper ones once a prefix of the full model has them all
        worth = count < minimum + NEAR_DEPTHS or set(prints[:count]) >= variants
        if worth and _holds(model_class, shrink_to, count, keys, variants):
            break
        count += 1
    return count, len(variants)


def _follows_count(model_class: Any, shrink_to: ShrinkTo, count: int) -> bool:
    """Whether the decoder layer list has ``count`` layers in the model built
    with that count (not so for an encoder-decoder's decoder)."""
    try:
        return layer_facts(model_class, shrink_to(count), count) is not None
    except Exception:  # noqa: BLE001 - transformers' model code
        return False


def _holds(model_class: Any, shrink_to: ShrinkTo, count: int, keys: set, variants: set) -> bool:
    """Whether the model built with ``count`` layers holds every variant."""
    try:
        built = layer_facts(model_class, shrink_to(count), count)
    except Exception:  # noqa: BLE001 - transformers' model code
        return False
    return built is not None and set(fingerprints(built, keys)) >= variants
