"""Expert counts a default config leaves unset, which its model cannot be built without.

Dots1Config's defaults leave ``n_routed_experts``, ``num_experts_per_tok`` and
``n_shared_experts`` None, and Dots1's MoE layer builds
``torch.empty(n_routed_experts, ...)`` and a shared MLP of
``moe_intermediate_size * n_shared_experts`` columns from them: the shrunk
default config builds nothing (``TypeError: empty() takes 1 positional
argument but 3 were given``). Only when the shrunk config does not build are
such None counts given their tiny values (the experts and top-k of
``TINY_DIMENSIONS``, one shared expert); a config that builds with them None
(None meaning "none" for its code) is left as it is.
"""

from __future__ import annotations

from typing import Any

# a None count of shared experts is given one (TINY_DIMENSIONS has no such size)
_SHARED_EXPERT_COUNTS = ("n_shared_experts", "num_shared_experts")
_EXPERT_COUNTS = ("num_experts", "num_local_experts", "n_routed_experts", "num_experts_per_tok")


def _builds(model_class: Any, config: Any) -> bool:
    import torch

    try:
        with torch.device("meta"):
            model_class(config)
    except Exception:  # noqa: BLE001 - transformers' own model code
        return False
    return True


def unset_counts(config: Any, sizes: dict[str, int]) -> dict[str, int]:
    """The expert counts ``config`` has and leaves None, with their tiny values."""
    found = {name: sizes[name] for name in _EXPERT_COUNTS if name in sizes}
    found.update({name: 1 for name in _SHARED_EXPERT_COUNTS})
    return {name: v for name, v in found.items() if hasattr(config, name) and getattr(config, name) is None}


def fill_unset_counts(model_class: Any, config: Any, sizes: dict[str, int]) -> dict[str, int]:
    """Give ``config``'s None expert counts their tiny values when the model
    does not build without them and does with them; the values set."""
    unset = unset_counts(config, sizes)
    if not unset or _builds(model_class, config):
        return {}
    for name, value in unset.items():
        setattr(config, name, value)
    if _builds(model_class, config):
        return unset
    for name in unset:  # not what it lacked: the build's own error is reported as before
        setattr(config, name, None)
    return {}
