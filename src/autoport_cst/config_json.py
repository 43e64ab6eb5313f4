"""A checkpoint's ``config.json`` read the way transformers reads it.

transformers writes the floats JSON cannot hold (infinity, NaN) as tagged
objects, ``{"__float__": "Infinity"}`` (Mamba-2 style ``time_step_limit`` of
Bamba, Falcon-H1, GraniteMoE-hybrid, Nemotron-H), and turns them back into
floats when it reads the file. ``decode_floats`` does the same to values
read with ``json.loads``; ``config_object`` builds the configuration object
through the config class's ``from_dict``, the path ``from_pretrained``
takes. Every reader of a config.json in the project goes through here.

The core install has no transformers: ``load_config_values`` needs only the
standard library.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

FLOAT_TAG = "__float__"
TAGGED_FLOATS = {"Infinity": math.inf, "-Infinity": -math.inf, "NaN": math.nan}


def decode_floats(value: Any) -> Any:
    """``value`` with every ``{"__float__": "Infinity" | "-Infinity" |
    "NaN"}`` replaced by the float; anything else unchanged."""
    if isinstance(value, dict):
        tag = value.get(FLOAT_TAG)
        if len(value) == 1 and isinstance(tag, str) and tag in TAGGED_FLOATS:
            return TAGGED_FLOATS[tag]
        return {key: decode_floats(item) for key, item in value.items()}
    if isinstance(value, list):
        return [decode_floats(item) for item in value]
    return value


def parse_config_text(text: str) -> Any:
    """The JSON document ``text`` with its tagged floats decoded; raises
    ``json.JSONDecodeError`` as ``json.loads`` does."""
    return decode_floats(json.loads(text))


def load_config_values(path: str | Path) -> Any:
    """``path`` (a config.json) read and decoded (``parse_config_text``)."""
    return parse_config_text(Path(path).read_text(encoding="utf-8"))


def config_object(values: dict[str, Any]) -> Any:
    """The transformers configuration of ``values`` (decoded config.json
    values holding ``model_type``), built by its class's ``from_dict``.
    Raises KeyError for an unknown model_type and whatever the class's
    validators raise."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    values = decode_floats(dict(values))
    config_class = CONFIG_MAPPING[values["model_type"]]
    settings = {key: value for key, value in values.items() if key != "model_type"}
    return config_class.from_dict(settings)


def is_vision_language(config: Any) -> bool:
    """Whether a config.json's values describe a vision-language model: a
    text config and a vision config (Qwen3-VL's ``text_config`` and
    ``vision_config``)."""
    return (
        isinstance(config, dict)
        and isinstance(config.get("text_config"), dict)
        and isinstance(config.get("vision_config"), dict)
    )


def checkpoint_is_vision_language(checkpoint_dir: str | Path) -> bool:
    """``is_vision_language`` of the checkpoint's config.json."""
    return is_vision_language(load_config_values(Path(checkpoint_dir) / "config.json"))
