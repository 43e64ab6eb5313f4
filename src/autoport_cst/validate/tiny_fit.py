"""What a shrunk config must be given besides the tiny dimensions, read from
the config itself (no table keyed by model name):

- per-layer overrides of a heterogeneous config (transformers'
  ``per_layer_config``: Gemma 4's full-attention layers with a ``head_dim``
  of 512 beside 256) are taken off while the global values shrink, then put
  back on the layers the tiny model keeps, each overridden size keeping its
  ratio to the global one (512 / 256: 32 beside 16);
- a count of layers (``num_*_layers``) that would cover every layer of the
  tiny model keeps its share of the original depth, at least one layer on
  either side (Gemma 3n's ``num_kv_shared_layers``, 15 of 35 layers reading
  the keys and values of earlier ones: 4 of 10), so that the layers it
  counts and the others are both built;
- a field the config class declares with a string placeholder it resolves
  at init from other fields (Bamba's and Granite-MoE-Hybrid's
  ``mamba_d_head = "auto"``: ``mamba_expand * hidden_size //
  mamba_n_heads``) is resolved again from the shrunk values;
- a config whose text model has a config of its own (``get_text_config()``
  another object: Fuyu's Persimmon ``text_config``, the Gemma 4 assistant's
  Gemma 4 text config) has that one shrunk as any config, and the top
  level's own widths of a hidden state (``*hidden_size``: the assistant's
  ``backbone_hidden_size``, the width of the target model's states it
  projects) set to the shrunk text model's;
- a KV head count under another name than ``num_key_value_heads``
  (Falcon's ``num_kv_heads``: a field whose name reads so with ``kv`` for
  ``key_value``, or an ``attribute_map`` alias of it) shrinks too: to the
  tiny query heads when it equals the original ones, else to the tiny KV
  head count; left at 71 (of 71 query heads, Falcon's default), a Falcon
  without multi-query attention and its 4 tiny query heads would not load;
- a tiny size the config class derives at init instead of declaring it as
  a field (FalconConfig's ``num_key_value_heads`` since transformers 5.25:
  ``num_kv_heads``, or 1 with multi-query attention) is derived again from
  the shrunk fields: set to the tiny KV head count, config.json would say 2
  where the model builds 1 or 4 (transformers keeps a value config.json
  gives, so the written file must agree with the fields it derives from).
"""

from __future__ import annotations

import copy
import dataclasses
import re
from collections.abc import Callable
from typing import Any, TypeGuard


def text_sub_config(config: Any) -> Any:
    """The config of the text model when it is another object than
    ``config`` (a ``text_config`` nested in it), else None."""
    try:
        text = config.get_text_config()
    except Exception:  # noqa: BLE001 - a config without sub-configs
        return None
    return None if text is config or text is None else text


def shrink_text_sub_config(config: Any, shrink: Callable[[Any], Any]) -> None:
    """Shrink the nested text config of ``config`` with ``shrink`` (the
    shrinker of any config; the names it sets on the whole model's config,
    ``architectures``, kept as they were), then the top level's integer
    ``*hidden_size`` fields to the text model's hidden size."""
    text = text_sub_config(config)
    if text is None:
        return
    architectures = getattr(text, "architectures", None)
    shrink(text)
    text.architectures = architectures
    hidden = getattr(text, "hidden_size", None)
    if not _is_int(hidden):
        return
    for name, value in list(vars(config).items()):
        if name.endswith("hidden_size") and _is_int(value):
            setattr(config, name, hidden)


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def take_per_layer_overrides(config: Any) -> tuple[dict[int, dict[str, Any]], dict[str, Any]] | None:
    """The per-layer overrides of a heterogeneous config, taken off it (its
    global values then read and set as any config's), and the global values
    of the attributes they override; None for a homogeneous config."""
    spec = vars(config).get("_heterogeneity_spec")
    if spec is None:
        return None
    overrides = copy.deepcopy(spec.per_layer_overrides)
    config.per_layer_config = None
    names = {name for values in overrides.values() for name in values}
    return overrides, {name: getattr(config, name, None) for name in names}


def restore_per_layer_overrides(
    config: Any, taken: tuple[dict[int, dict[str, Any]], dict[str, Any]] | None
) -> None:
    """Put the overrides back on the layers the shrunk config keeps, each
    overridden integer size scaled as its global value was."""
    if taken is None:
        return
    overrides, before = taken
    layers = getattr(config, "num_hidden_layers", None)
    kept: dict[int, dict[str, Any]] = {}
    for index, values in overrides.items():
        if _is_int(layers) and index >= layers:
            continue
        layer: dict[str, Any] = {}
        for name, value in values.items():
            old, new = before.get(name), getattr(config, name, None)
            if _is_int(value) and _is_int(old) and _is_int(new) and old and new != old:
                value = max(1, value * new // old)
            layer[name] = value
        kept[index] = layer
    config.per_layer_config = kept


def fit_layer_counts(config: Any, original_layers: Any, given: set[str]) -> None:
    """A ``num_*_layers`` count (not the layer count itself, nor given)
    that would cover every layer of the tiny model keeps its share of the
    original depth, between 1 and the tiny depth less 1; one that counts
    every layer still does (the Gemma 4 assistant's ``num_kv_shared_layers``:
    all its layers read the keys and values of the target model)."""
    layers = getattr(config, "num_hidden_layers", None)
    if not _is_int(layers) or not _is_int(original_layers) or original_layers <= layers or layers < 2:
        return
    aliases = set(getattr(type(config), "attribute_map", {}).values())
    for name, value in list(vars(config).items()):
        if (
            name.startswith("num_")
            and name.endswith("_layers")
            and name != "num_hidden_layers"
            and name not in aliases
            and name not in given
            and _is_int(value)
            and layers <= value <= original_layers
        ):
            share = min(layers - 1, max(1, round(value * layers / original_layers)))
            setattr(config, name, layers if value == original_layers else share)


KV_HEADS = "num_key_value_heads"


def _names_kv_heads(name: str) -> bool:
    spelled = re.sub(r"(^|_)kv(_|$)", r"\1key_value\2", name)
    return re.sub(r"^n_", "num_", spelled) == KV_HEADS


def kv_head_fields(config: Any) -> list[str]:
    """The fields of ``config`` other than ``num_key_value_heads`` that
    hold its KV head count: named so with ``kv`` for ``key_value`` (and
    ``n_`` for ``num_``), or mapped to or from it by the class's
    ``attribute_map``."""
    mapped = getattr(type(config), "attribute_map", {}) or {}
    aliases = {key for key, value in mapped.items() if value == KV_HEADS}
    aliases |= {value for key, value in mapped.items() if key == KV_HEADS}
    return [
        name
        for name, value in vars(config).items()
        if name != KV_HEADS and _is_int(value) and (name in aliases or _names_kv_heads(name))
    ]


def fit_kv_head_fields(config: Any, size: int, original_heads: Any, given: set[str]) -> None:
    """Each of ``kv_head_fields`` not given shrinks: one equal to the
    original query heads (a KV head per query head, as Falcon's code needs
    without ``new_decoder_architecture``) to the tiny query heads, any other
    to ``size``, the tiny KV head count, when it divides the query heads."""
    heads = getattr(config, "num_attention_heads", None)
    if not _is_int(heads):
        return
    for name in kv_head_fields(config):
        if name in given:
            continue
        if getattr(config, name) == original_heads:
            setattr(config, name, heads)
        elif heads % size == 0:
            setattr(config, name, size)


def rederive_placeholders(config: Any, given: set[str], values: dict[str, Any]) -> None:
    """Fields declared with a string placeholder (``"auto"``) that the
    config resolved at init: resolved again from ``values`` (the shrunk
    config's), unless given; left as they are when the class refuses."""
    config_class: Any = type(config)
    if not dataclasses.is_dataclass(config_class):
        return
    pending = {
        field.name: field.default
        for field in dataclasses.fields(config_class)
        if isinstance(field.default, str)
        and field.name not in given
        and not isinstance(getattr(config, field.name, None), (str, type(None)))
    }
    if not pending:
        return
    try:
        fresh = getattr(config_class, "from_dict")({**values, **pending})  # noqa: B009 - not typed as a dataclass's
    except Exception:  # noqa: BLE001 - the config class's own validators
        return
    for name in pending:
        setattr(config, name, getattr(fresh, name))


def derived_sizes(config: Any, names: list[str]) -> list[str]:
    """The ``names`` that ``config`` has as attributes but its class does
    not declare as fields: values its ``__post_init__`` derives. A name the
    class's ``attribute_map`` aliases a declared field to (Kolibri's
    ``num_local_experts`` for ``num_experts``) holds that field: not derived."""
    config_class: Any = type(config)
    if not dataclasses.is_dataclass(config_class):
        return []
    declared = {field.name for field in dataclasses.fields(config_class)}
    aliases = set(dict(getattr(config_class, "attribute_map", None) or {}).values())
    return [name for name in names if name not in declared | aliases and name in vars(config)]


def rederive_sizes(config: Any, names: list[str], values: dict[str, Any]) -> None:
    """The derived attributes ``names`` set again as the config class derives
    them from ``values`` (the shrunk config's, without ``names``); left as
    they are when the class refuses."""
    if not names:
        return
    config_class: Any = type(config)
    try:
        fresh = config_class.from_dict({k: v for k, v in values.items() if k not in names})
    except Exception:  # noqa: BLE001 - the config class's own validators
        return
    for name in names:
        if hasattr(fresh, name):
            setattr(config, name, getattr(fresh, name))


def derived_defaults(config: Any, values: dict[str, Any]) -> dict[str, Any]:
    """The declared fields with a default of None that hold a number the
    config class computes from the other fields when the field is absent
    (Falcon's ``ffn_hidden_size``: 4 x ``hidden_size``, which a real
    config.json leaves out): name -> value. ``values`` are the config's."""
    config_class: Any = type(config)
    found: dict[str, Any] = {}
    for field in dataclasses.fields(config_class) if dataclasses.is_dataclass(config_class) else ():
        value = getattr(config, field.name, None)
        if field.default is not None or not _is_int(value):
            continue
        try:
            fresh = config_class.from_dict({k: v for k, v in values.items() if k != field.name})
        except Exception:  # noqa: BLE001 - the config class's own validators
            continue
        if getattr(fresh, field.name, None) == value:
            found[field.name] = value
    return found


def untouched(config: Any, defaults: dict[str, Any], given: dict[str, int] | None) -> list[str]:
    """The ``defaults`` (:func:`derived_defaults`) that shrinking left as they
    were and the user did not give: derived again from the shrunk fields."""
    return [n for n, v in defaults.items() if getattr(config, n, None) == v and n not in (given or {})]
