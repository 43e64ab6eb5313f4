"""Config fields a port reads under a name transformers only aliases.

A transformers config class may answer to a second name for a field
(``attribute_map``: ``config.num_experts`` reads ``num_local_experts`` on
Qwen3-MoE in transformers 5). ``to_dict()`` and ``config.json`` carry only the
real name, so a port whose ``from_configs`` keeps the keys of the dict that
match its dataclass fields never sees the alias: the field keeps its default
(128 experts for a checkpoint of 4), and the model built from it is wrong for
every checkpoint. The driver checks this right after building the port and
names each such field, instead of the shape or numeric error it causes later.
"""

from __future__ import annotations

import dataclasses
from typing import Any


def aliased_fields_missed(model: Any, hf_config: Any) -> list[str]:
    """One line per field of the port's config dataclass (``model.config``)
    that is an alias in ``hf_config.attribute_map`` and whose value differs
    from what the model's config answers under that alias."""
    config = getattr(model, "config", None)
    if config is None or not dataclasses.is_dataclass(config):
        return []
    aliases = getattr(hf_config, "attribute_map", None) or {}
    fields = {field.name for field in dataclasses.fields(config)}
    return [
        line
        for alias, target in sorted(aliases.items())
        if alias in fields and (line := _missed(config, hf_config, alias, target))
    ]


def _missed(config: Any, hf_config: Any, alias: str, target: str) -> str | None:
    expected = getattr(hf_config, target, None)
    got = getattr(config, alias, None)
    if expected is None or _same(got, expected):
        return None
    return (
        f"`{alias}` is {got!r} where the model's config has {expected!r}: transformers writes it as "
        f"`{target}` (`{alias}` is only an alias of the config object), so a config read from "
        f"`to_dict()` or config.json never carries `{alias}`; read `{target}` too"
    )


def _same(got: Any, expected: Any) -> bool:
    try:
        return bool(got == expected)
    except Exception:  # noqa: BLE001 - values without a plain equality (tensors): not judged
        return True
