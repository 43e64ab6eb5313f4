"""The model configuration as the interpreter sees it: every attribute read
logged (so an analysis can name the config key that holds a value)."""

from __future__ import annotations

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

    def copy(self) -> ConfigProxy:
        return ConfigProxy(self._config, self._log, dict(self.overrides or {}))

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
    if hasattr(value, "to_dict") and hasattr(value, "model_type"):
        return ConfigProxy(value, log)  # a nested sub-config
    return value
