"""Stand-in for ``libtorch_neuronx_lite.compile.platform``: which Neuron
platform the model is built for. Factories choose an implementation by it
(``trn3`` selects MX-FP4 / MX-FP8 variants), and the FP8 range of the KV
cache follows it.

The CPU validation builds for Trainium2 (``trn2``) unless
``NEURON_PLATFORM_TARGET_OVERRIDE`` names another target, as the Neuron CPU
compile mode does.
"""

from __future__ import annotations

import os

DEFAULT_TARGET = "trn2"
OVERRIDE_VARIABLE = "NEURON_PLATFORM_TARGET_OVERRIDE"


def get_platform_target() -> str:
    """The platform name, e.g. ``"trn2"``."""
    return os.environ.get(OVERRIDE_VARIABLE) or DEFAULT_TARGET
