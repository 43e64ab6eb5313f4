"""A CPU stand-in for the ``vllm_neuron`` (and needed ``vllm``) API surface.

Model packages for the vLLM Neuron backend import ``vllm_neuron.*``,
``vllm.distributed.parallel_state`` and ``vllm.config``. Neither runs on a
machine without Trainium, so validation installs this package's modules under
those names, inside the validation process only and only where the real
package is absent:

- ``vllm_neuron`` (and ``nkilib``): installed when not importable;
- ``vllm``: installed when not importable; when vLLM is installed but has no
  distributed state, only its parallel-state getters are replaced.

``standin_installed(device_group)`` is a context manager that installs and,
on exit, removes everything it added (and restores what it patched).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from . import (
    checkpoints,
    common_types,
    decode_attention,
    decode_mask,
    dtype_utils,
    functional,
    kernel_phases,
    kv_cache,
    layers,
    mla,
    moe,
    neuron_config,
    neuron_platform,
    nki_language,
    parallel_state,
    prefill_attention,
    projections,
    spec_decode,
    vllm_config,
    weight_loader,
)
from .collectives import LOCAL_GROUP

_MARKER = "__autoport_standin__"

# foreign module name -> (implementation module, names to export or None for all public)
VLLM_NEURON_MODULES: dict[str, tuple[types.ModuleType | None, tuple[str, ...] | None]] = {
    "vllm_neuron": (None, None),
    "vllm_neuron.functional": (functional, None),
    "vllm_neuron.functional.attention": (None, None),
    "vllm_neuron.functional.attention.attention_decode": (
        decode_attention,
        (
            "attention_decode",
            "packed_fp8_viable_for_bucket",
            "swizzle_packed_k",
            "unswizzle_packed_k",
            "_swizzle_packed_k",
            "_unswizzle_packed_k",
        ),
    ),
    "vllm_neuron.functional.attention.attention_decode_mask": (
        decode_mask,
        ("gen_attention_decode_mask", "_resize_block_len", "P_MAX"),
    ),
    "vllm_neuron.functional.attention.attention_segmented_cte": (
        prefill_attention,
        ("segmented_attention", "segmented_attention_cp", "SUPPORTED_KV_SEGMENT_SIZES"),
    ),
    "vllm_neuron.functional.attention.attention_cte": (prefill_attention, ("flash_attention",)),
    "vllm_neuron.functional.attention.qkv": (projections, ("qkv_proj",)),
    "vllm_neuron.functional.attention.mla_absorb": (mla, ("mla_absorb",)),
    "vllm_neuron.functional.attention.mla_decode": (mla, ("mla_decode_attention",)),
    "vllm_neuron.functional.attention.o_proj": (projections, ("o_proj",)),
    "vllm_neuron.nn": (layers, ("ColumnParallelLinear", "RowParallelLinear", "VocabDimShardedEmbedding")),
    "vllm_neuron.nn.embedding": (layers, ("VocabDimShardedEmbedding",)),
    "vllm_neuron.nn.sampler": (layers, ("Sampler",)),
    "vllm_neuron.model": (None, None),
    "vllm_neuron.model.kv_cache": (kv_cache, None),
    "vllm_neuron.model.neuron_config": (neuron_config, None),
    "vllm_neuron.utils": (None, None),
    "vllm_neuron.utils.weight_loader": (weight_loader, None),
    "vllm_neuron.utils.checkpoints": (checkpoints, None),
    "vllm_neuron.utils.dtype_utils": (dtype_utils, None),
    "vllm_neuron.parallel": (None, None),
    "vllm_neuron.parallel.neuron_parallel_state": (parallel_state, None),
    "vllm_neuron.vllm": (None, None),
    "vllm_neuron.vllm.spec_decode": (None, None),
    "vllm_neuron.vllm.spec_decode.decorator": (spec_decode, ("async_speculative_decoding",)),
}
NKILIB_MODULES: dict[str, tuple[types.ModuleType | None, tuple[str, ...] | None]] = {
    "nkilib": (None, None),
    "nkilib.core": (None, None),
    "nkilib.core.utils": (None, None),
    "nkilib.core.utils.common_types": (common_types, None),
    "nkilib.core.moe": (None, None),
    "nkilib.core.moe.moe_cte": (None, None),
    "nkilib.core.moe.moe_cte.moe_cte": (
        moe,
        ("MoECTEImplementation", "ActFnType", "ExpertAffinityScaleMode"),
    ),
}
NEURONX_LITE_MODULES: dict[str, tuple[types.ModuleType | None, tuple[str, ...] | None]] = {
    "libtorch_neuronx_lite": (None, None),
    "libtorch_neuronx_lite.compile": (None, None),
    "libtorch_neuronx_lite.compile.platform": (neuron_platform, ("get_platform_target",)),
}
NKI_MODULES: dict[str, tuple[types.ModuleType | None, tuple[str, ...] | None]] = {
    "nki": (None, None),
    "nki.language": (nki_language, None),
}
VLLM_MODULES: dict[str, tuple[types.ModuleType | None, tuple[str, ...] | None]] = {
    "vllm": (None, None),
    "vllm.distributed": (
        parallel_state,
        ("get_tp_group", "get_dp_group", "get_pp_group", "get_dcp_group", "get_world_group"),
    ),
    "vllm.distributed.parallel_state": (parallel_state, None),
    "vllm.config": (vllm_config, None),
    "vllm.model_executor": (None, None),
    "vllm.model_executor.models": (None, None),
    "vllm.model_executor.models.interfaces": (spec_decode, ("SupportsEagle3",)),
}
# Replaced on a real vLLM that has no distributed state.
VLLM_PARALLEL_STATE_GETTERS = (
    "get_tp_group",
    "get_dp_group",
    "get_dcp_group",
    "get_pp_group",
    "get_wide_ep_group",
    "get_tensor_model_parallel_world_size",
    "get_tensor_model_parallel_rank",
)


@dataclass
class Installation:
    """What ``standin_installed`` changed, to report and to undo."""

    added_modules: list[str] = field(default_factory=list)
    patched: list[tuple[Any, str, Any]] = field(default_factory=list)
    real_packages: list[str] = field(default_factory=list)

    def describe(self) -> dict[str, Any]:
        roots = sorted({name.split(".")[0] for name in self.added_modules})
        described: dict[str, Any] = {
            "stand_in_packages": roots,
            "real_packages": sorted(self.real_packages),
            "patched": sorted(
                f"{getattr(owner, '__name__', owner)}.{name}" for owner, name, _ in self.patched
            ),
        }
        layout = parallel_state.expert_parallel_layout()
        if layout is not None:
            described["expert_parallel"] = layout
        if any(kernel_phases.calls().values()):
            described["kernel_calls"] = kernel_phases.calls()
        return described


# A submodule every real installation of each package has. A directory named
# like the package without it (a port's output tree ``OUT/vllm_neuron/model/``
# on sys.path, seen as a namespace package) is not the real package.
_PROBES = {
    "vllm_neuron": "vllm_neuron.functional",
    "vllm": "vllm.distributed",
    "nkilib": "nkilib.core",
    "nki": "nki.language",
    "libtorch_neuronx_lite": "libtorch_neuronx_lite.compile",
}


def _is_importable(name: str) -> bool:
    module = sys.modules.get(name)
    if module is not None and getattr(module, _MARKER, False):
        return False
    try:
        spec = importlib.util.find_spec(name) if module is None else module.__spec__
        if spec is None:
            return False
        if spec.origin in (None, "namespace") and name in _PROBES:
            return importlib.util.find_spec(_PROBES[name]) is not None
        return True
    except (ImportError, ValueError):
        return False


def _make_module(
    name: str, source: types.ModuleType | None, names: tuple[str, ...] | None
) -> types.ModuleType:
    module = types.ModuleType(name, (source.__doc__ if source else None) or f"CPU stand-in for {name}")
    module.__path__ = []  # a package: submodules resolve through sys.modules
    setattr(module, _MARKER, True)
    if source is not None:
        exported = names if names is not None else [n for n in vars(source) if not n.startswith("_")]
        for attribute in exported:
            setattr(module, attribute, getattr(source, attribute))
    return module


def _install_tree(
    table: dict[str, tuple[types.ModuleType | None, tuple[str, ...] | None]], installation: Installation
) -> None:
    for name, (source, names) in table.items():
        module = _make_module(name, source, names)
        sys.modules[name] = module
        installation.added_modules.append(name)
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(sys.modules[parent], child, module)


def _vllm_has_distributed_state(parallel_state_module: types.ModuleType) -> bool:
    check = getattr(parallel_state_module, "model_parallel_is_initialized", None)
    if callable(check):
        try:
            return bool(check())
        except Exception:  # noqa: BLE001 - a partial install counts as no state
            return False
    return getattr(parallel_state_module, "_TP", None) is not None


def install(installation: Installation) -> None:
    """Install the stand-in modules where the real packages are absent."""
    if _is_importable("vllm_neuron"):
        installation.real_packages.append("vllm_neuron")
    else:
        _install_tree(VLLM_NEURON_MODULES, installation)
    if _is_importable("nkilib"):
        installation.real_packages.append("nkilib")
    else:
        _install_tree(NKILIB_MODULES, installation)
    if _is_importable("nki"):
        installation.real_packages.append("nki")
    else:
        _install_tree(NKI_MODULES, installation)
    if _is_importable("libtorch_neuronx_lite"):
        installation.real_packages.append("libtorch_neuronx_lite")
    else:
        _install_tree(NEURONX_LITE_MODULES, installation)
    if not _is_importable("vllm"):
        _install_tree(VLLM_MODULES, installation)
        return
    installation.real_packages.append("vllm")
    real = importlib.import_module("vllm.distributed.parallel_state")
    if _vllm_has_distributed_state(real):
        return
    for attribute in VLLM_PARALLEL_STATE_GETTERS:
        installation.patched.append((real, attribute, getattr(real, attribute, None)))
        setattr(real, attribute, getattr(parallel_state, attribute))
    distributed: Any = sys.modules.get("vllm.distributed")  # a real vllm module, whatever it defines
    if distributed is not None and hasattr(distributed, "get_tp_group"):
        installation.patched.append((distributed, "get_tp_group", distributed.get_tp_group))
        distributed.get_tp_group = parallel_state.get_tp_group


def uninstall(installation: Installation) -> None:
    for name in reversed(installation.added_modules):
        sys.modules.pop(name, None)
    for owner, attribute, previous in reversed(installation.patched):
        if previous is None:
            with contextlib.suppress(AttributeError):
                delattr(owner, attribute)
        else:
            setattr(owner, attribute, previous)
    installation.added_modules.clear()
    installation.patched.clear()


@contextlib.contextmanager
def standin_installed(
    device_group: Any = LOCAL_GROUP,
    tensor_parallel_size: int | None = None,
    model: str = "",
    ep_degree: int = 1,
    cache_dtype: str = "auto",
    layout: Any = None,
    rank: int = 0,
) -> Iterator[Installation]:
    """Install the stand-in for the duration of the block, with
    ``device_group`` as the tensor-parallel group. With ``ep_degree > 1``
    expert parallelism is enabled (``enable_expert_parallel``) with that many
    expert partitions inside the TP world (see ``parallel_state``). A
    ``layout`` with data or context parallelism (``ParallelLayout``) lays out
    its groups over the default torch.distributed group instead, this process
    being global rank ``rank`` (``parallel_state.configure_layout``); the
    vLLM config then describes the decode graph."""
    installation = Installation()
    kernel_phases.reset()
    if layout is not None and layout.disaggregated:
        parallel_state.configure_layout(layout, rank)
        vllm_config.configure(
            layout.tp,
            model=model,
            cache_dtype=cache_dtype,
            data_parallel_size=layout.dp,
            decode_context_parallel_size=layout.dcp,
            cp_kv_cache_interleave_size=layout.dcp_interleave,
        )
    else:
        parallel_state.configure(device_group, ep_degree)
        vllm_config.configure(
            tensor_parallel_size or parallel_state.get_tp_group().world_size,
            model=model,
            enable_expert_parallel=ep_degree > 1,
            cache_dtype=cache_dtype,
        )
    try:
        install(installation)
        yield installation
    finally:
        uninstall(installation)
        parallel_state.reset()
        vllm_config.configure(1)


__all__ = ["Installation", "LOCAL_GROUP", "install", "standin_installed", "uninstall"]
