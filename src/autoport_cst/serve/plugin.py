"""vLLM entry points (``vllm.platform_plugins`` and ``vllm.general_plugins``).

Both are inert unless ``AUTOPORT_STANDIN=1``: without it the platform hook
returns None (vLLM picks its own platform) and the general hook registers
nothing, so installing this package never changes another use of vLLM.

With it, the platform is ``StandinPlatform`` (vLLM's CPU platform whose
worker runs the port), and every architecture of the port tree's registry
is registered with vLLM's model registry, so that vLLM's config checks
accept an architecture vLLM itself does not implement. The class registered
(``vllm_model.PortedForCausalLM``) is never built: the worker builds the
port through the port's own registry.
"""

from __future__ import annotations

import os

ACTIVATION_VARIABLE = "AUTOPORT_STANDIN"
PLATFORM = "autoport_cst.serve.platform.StandinPlatform"


def active() -> bool:
    return os.environ.get(ACTIVATION_VARIABLE) == "1"


def platform_plugin() -> str | None:
    """The platform's qualified name when the stand-in is asked for."""
    return PLATFORM if active() else None


def register_architectures() -> None:
    """Register the port tree's architectures with vLLM (when active). The
    tree found is recorded in ``AUTOPORT_PORT_DIR`` for vLLM's child
    processes, which do not share the script path."""
    if not active():
        return
    from vllm import ModelRegistry

    from .port_tree import PORT_DIR_VARIABLE, find_port_tree, registry_architectures
    from .vllm_model import PortedForCausalLM

    tree = find_port_tree()
    os.environ[PORT_DIR_VARIABLE] = str(tree)
    for architecture in registry_architectures(tree):
        ModelRegistry.register_model(architecture, PortedForCausalLM)
