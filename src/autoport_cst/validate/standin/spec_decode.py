"""Stand-ins for the speculative-decoding hooks model classes are decorated
with: the decorator is the identity and the Eagle3 interface a marker."""

from __future__ import annotations


def async_speculative_decoding(cls):
    return cls


class SupportsEagle3:
    """Marker mixin (vllm.model_executor.models.interfaces)."""

    supports_eagle3 = True
