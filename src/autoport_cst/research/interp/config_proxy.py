"""The model configuration as the interpreter sees it: every attribute read
logged (so an analysis can name the config key that holds a value)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from autoport_cst.research.interp.values import UNKNOWN


class ConfigProxy:
    """Attribute access on the model configuration, logged. A copy the code
    makes (``copy.deepcopy(config)``) holds the attributes the code then
    sets on it (``overrides``); the configuration itself is never written."""

    def __init__(self, config: Any, log: list[set[str]], overrides: dict[str, Any] | None = None) -> None:
        self._config = config
        self._log = log
        self.overrides = overrides

    @property
    def config_class(self) -> type:
        """The class of the model configuration (its properties are code)."""
        return type(self._config)

    @property
    def wrapped(self) -> Any:
        """The model configuration itself, unlogged: for transformers'
        own functions of it (the RoPE frequencies), not for reads."""
        return self._config

    def copy(self) -> ConfigProxy:
        return ConfigProxy(self._config, self._log, dict(self.overrides or {}))

    def write(self, name: str, value: Any) -> None:
        """``config.name = value`` in the model's code: later reads of this
        configuration (or of the copy it is) see ``value``, as transformers'
        modules see the one configuration object an ``__init__`` set a field
        of (Falcon's decoder layer sets ``num_ln_in_parallel_attn`` to 2 where
        config.json has none, and its forward reads the 2)."""
        if self.overrides is None:
            self.overrides = {}
        self.overrides[name] = value

    def read(self, name: str, default: Any = UNKNOWN) -> Any:
        for frame in self._log:
            frame.add(name)
        if self.overrides is not None and name in self.overrides:
            return self.overrides[name]
        try:
            value = getattr(self._config, name) if not isinstance(self._config, dict) else self._config[name]
        except Exception:  # missing, or a config that refuses the access (per-layer attributes)
            return default
        return _freeze_config_value(value, self._log)

    def text_config(self) -> ConfigProxy:
        """``config.get_text_config()``: the sub-config of the text model
        (this configuration itself when it has none), logged like it."""
        try:
            value = self._config.get_text_config()
        except Exception:  # a dict, or a config without the method
            return self
        return self if value is self._config else _freeze_config_value(value, self._log)

    def has(self, name: str) -> bool:
        if self.overrides is not None and name in self.overrides:
            return True
        if isinstance(self._config, dict):
            return name in self._config
        try:
            getattr(self._config, name)
        except Exception:
            return False
        return True


def _freeze_config_value(value: Any, log: list[set[str]]) -> Any:
    if _is_config(value):
        return ConfigProxy(value, log)  # a nested sub-config
    if _is_per_layer_view(value):
        # a heterogeneous config's ``per_layer_config``: each layer's own
        # config (its overrides applied: Gemma 4's full-attention head_dim)
        return tuple(ConfigProxy(layer, log) for layer in value)
    return value


def _is_config(value: Any) -> bool:
    return hasattr(value, "to_dict") and hasattr(value, "model_type")


def _is_per_layer_view(value: Any) -> bool:
    """transformers' per-layer view of a heterogeneous config (a sequence of
    the layers' configs), not a plain list or tuple of config values."""
    if isinstance(value, (str, bytes, list, tuple, dict)) or not isinstance(value, Sequence):
        return False
    try:
        return len(value) > 0 and all(_is_config(layer) for layer in value)
    except Exception:  # noqa: BLE001 - a view that refuses to be read
        return False
