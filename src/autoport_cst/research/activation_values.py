"""An activation module written out in the modeling code, named by its
values: BLOOM's ``BloomGelu`` computes ``x * 0.5 * (1 + tanh(0.79788456 * x
* (1 + 0.044715 * x * x)))`` through an autograd function, which the
interpreter does not name. The module (no parameters, no submodules, built
without arguments) is run on a grid of float64 inputs and compared with each
of transformers' own activation functions (``ACT2FN``) that a port realizes;
it is that activation when every value agrees within ``TOLERANCE``, relative
to the value (``0.79788456`` is ``sqrt(2 / pi)`` to 1e-9; the next closest
pair, the erf and tanh forms of GELU, differ by up to 4.7e-4 at ``x = 2``)."""

from __future__ import annotations

import importlib
from functools import lru_cache

# transformers' names, tried in this order (the first within the tolerance is taken)
CANDIDATES = ("silu", "gelu", "gelu_pytorch_tanh", "relu", "relu2", "quick_gelu")
TOLERANCE = 1e-7
# the inputs: dense around 0, where the candidates differ most, out to +-20
GRID = (-20.0, 20.0, 8001)


@lru_cache(maxsize=32)
def activation_by_values(module: str, name: str) -> tuple[str, float] | None:
    """``(transformers activation name, largest relative difference)`` of the
    class ``name`` of the module ``module`` run on the grid, or None when it
    cannot be built without arguments, fails, or matches no candidate."""
    import torch
    from transformers.activations import ACT2FN

    try:
        cls = getattr(importlib.import_module(module), name)
        instance = cls()
        x = torch.linspace(*GRID[:2], GRID[2], dtype=torch.float64)
        with torch.no_grad():
            values = instance(x)
    except Exception:  # noqa: BLE001 - any failure of foreign code: not named by its values
        return None
    if not (isinstance(values, torch.Tensor) and values.shape == x.shape):
        return None
    for candidate in CANDIDATES:
        with torch.no_grad():
            expected = ACT2FN[candidate](x)
        worst = float(((values - expected).abs() / expected.abs().clamp(min=1.0)).max())
        if worst <= TOLERANCE:
            return candidate, worst
    return None
