"""Build a port the way the vLLM Neuron model runner does, on the stand-in.

``install_standin`` puts the CPU stand-in of the vllm_neuron API in place for
the life of the worker (``validate.standin``) and makes the port tree's
``vllm_neuron/model/`` the package ``vllm_neuron.model``, so that its
``registry.py`` imports under its real name and its relative imports of the
model packages resolve. ``build_port`` looks the checkpoint's architecture up
in ``get_models()`` by the exact string, then ``from_configs`` on the meta
device; ``load_port_weights`` calls ``load_weights(checkpoint_path, device,
cache_dir)``; ``bind_port_cache`` allocates the paged caches of
``get_kv_spec()``, binds them and checks that nothing is left on the meta
device (``validate.meta_tensors``), as the validator does.

Nothing here imports vLLM; the runner passes vLLM's objects in.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from autoport_cst.errors import InputError
from autoport_cst.validate.meta_tensors import guard_meta_attributes, unloaded_parameters_and_buffers
from autoport_cst.validate.standin import standin_installed

from .port_tree import match_architecture, registry_path

REGISTRY_MODULE = "vllm_neuron.model.registry"


class PortError(RuntimeError):
    """The port failed at a stage of serving (build, load, kv_cache,
    prefill, decode); the message says what and where."""

    def __init__(self, stage: str, message: str) -> None:
        super().__init__(f"{stage}: {message}")
        self.stage = stage


@dataclass
class LoadedPort:
    model: Any
    kv_spec: Any
    layer_names: list[str]
    guarded: list[str]


def install_standin(stack: contextlib.ExitStack, out_dir: Path, device_group: Any, tp: int) -> None:
    """The stand-in, installed until ``stack`` closes, with the port tree's
    model directory as ``vllm_neuron.model``."""
    stack.enter_context(standin_installed(device_group, tensor_parallel_size=tp))
    models = sys.modules["vllm_neuron.model"]
    previous = list(getattr(models, "__path__", []))
    models.__path__ = [str(registry_path(out_dir).parent)]

    def restore() -> None:
        models.__path__ = previous
        for name in [key for key in sys.modules if key.startswith("vllm_neuron.model.")]:
            if not hasattr(sys.modules[name], "__autoport_standin__"):
                del sys.modules[name]

    stack.callback(restore)


def registry_models(out_dir: Path) -> dict[str, Any]:
    """``get_models()`` of the port tree's registry, as a dict."""
    try:
        registry = importlib.import_module(REGISTRY_MODULE)
        return dict(registry.get_models())
    except Exception as error:
        raise PortError("build", f"importing {registry_path(out_dir)} failed: {describe(error)}") from error


def build_port(out_dir: Path, architecture: str, hf_config: Any, neuron_config: Any) -> Any:
    """The registry's class for ``architecture``, built on the meta device."""
    models = registry_models(out_dir)
    match_architecture(architecture, list(models), registry_path(out_dir))
    try:
        with torch.device("meta"):
            return models[architecture].from_configs(hf_config, neuron_config)
    except Exception as error:
        raise PortError("build", f"{describe(error)} in from_configs on the meta device") from error


def load_port_weights(model: Any, checkpoint: str, cache_dir: str | None) -> None:
    """``load_weights`` with the runner's positional arguments."""
    from autoport_cst.validate.standin.checkpoints import CheckpointError

    try:
        model.load_weights(checkpoint, torch.device("cpu"), cache_dir)
    except CheckpointError as error:
        raise PortError("load", f"{error} (parameter {error.parameter})") from error
    except Exception as error:
        raise PortError("load", f"{describe(error)} in load_weights") from error


def kv_layers(model: Any) -> Any:
    try:
        return model.get_kv_spec()
    except Exception as error:
        raise PortError("kv_cache", f"{describe(error)} in get_kv_spec") from error


def bind_port_cache(
    model: Any, kv_spec: Any, num_blocks: int, block_size: int, dtype: torch.dtype | None = None
) -> dict[str, tuple]:
    """Zeroed ``[num_blocks + 1, kv_heads, block_size, head]`` K and V per
    layer (the extra block takes the writes of slot -1), in the layer's dtype
    or ``dtype`` (an FP8 KV cache), bound to the model; then the meta-device
    check."""
    caches = {}
    for layer in kv_spec.layers:
        shape = (num_blocks + 1, layer.num_kv_heads, block_size, layer.head_size)
        cache_dtype = dtype or layer.dtype
        caches[layer.name] = (torch.zeros(shape, dtype=cache_dtype), torch.zeros(shape, dtype=cache_dtype))
    try:
        model.bind_kv_cache(caches)
    except Exception as error:
        raise PortError("kv_cache", f"{describe(error)} in bind_kv_cache") from error
    unloaded = unloaded_parameters_and_buffers(model)
    if unloaded:
        raise PortError(
            "load",
            "tensors still on the meta device after load_weights: " + "; ".join(unloaded),
        )
    return caches


def finish_loading(model: Any) -> list[str]:
    """Guard the plain meta tensor attributes left (see meta_tensors) and
    switch to eval mode; the guarded attribute names."""
    guarded = guard_meta_attributes(model)
    model.eval()
    return guarded


def checkpoint_architecture(checkpoint: str | Path) -> str:
    """``config.json``'s ``architectures[0]``."""
    from autoport_cst.config_json import load_config_values

    path = Path(checkpoint) / "config.json"
    try:
        values = load_config_values(path)
    except FileNotFoundError:
        raise InputError(f"{path}: no config.json") from None
    except ValueError as error:
        raise InputError(f"{path}: not JSON: {error}") from None
    architectures = values.get("architectures") if isinstance(values, dict) else None
    if not architectures or not isinstance(architectures[0], str):
        raise InputError(f"{path}: no architectures[0]")
    return architectures[0]


def describe(error: BaseException) -> str:
    """``Type: message`` plus the innermost frame outside this project and torch."""
    import traceback

    where = ""
    for frame in reversed(traceback.extract_tb(error.__traceback__)):
        if "autoport_cst" not in frame.filename and "/torch/" not in frame.filename:
            where = f" (at {frame.filename}:{frame.lineno}, in {frame.name})"
            break
    return f"{type(error).__name__}: {error}{where}"
