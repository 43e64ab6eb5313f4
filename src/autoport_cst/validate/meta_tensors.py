"""Tensors a port leaves on the meta device, and how strictly each kind is
treated.

The engine builds the model under ``torch.device("meta")``, so a tensor made
in ``__init__`` holds no data until ``load_weights`` replaces it.

- A parameter or a registered buffer still on meta after loading is an error
  at load time: the engine moves the model to the device, which fails on
  it.
- A plain tensor attribute (``self.k_scale = torch.ones(1, 1)``) is not
  moved by the engine and may never be read: real models keep FP8 KV-cache
  scales that way and read them only when the cache is FP8. Such an
  attribute is replaced by a guard that keeps its shape, dtype and device
  visible and raises ``UnloadedTensorError``, naming the attribute, as soon
  as the model computes with it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

# Tensor members that only describe the tensor (no data is read).
_DESCRIPTIVE = frozenset({"__get__", "dim", "size", "__repr__", "__format__", "ndimension", "numel"})


class UnloadedTensorError(RuntimeError):
    """The model computed with a tensor attribute that was never loaded."""


class UnloadedTensor(torch.Tensor):
    """A meta tensor attribute standing in until something reads it."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__name__", "") in _DESCRIPTIVE:
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args, **kwargs)
        where = _guard_name([*args, *kwargs.values()])
        raise UnloadedTensorError(
            f"tensor attribute '{where}' was computed in __init__ and is still on the meta device "
            f"(the engine builds the model under torch.device('meta')), but the model computes with "
            f"it ({getattr(func, '__name__', func)}): compute it in forward, or set it in load_weights"
        )


def _guard_name(values: list[Any]) -> str:
    for value in values:
        if isinstance(value, UnloadedTensor):
            return value.__dict__.get("autoport_name", "?")
        if isinstance(value, (list, tuple)):
            found = _guard_name(list(value))
            if found != "?":
                return found
    return "?"


def unloaded_parameters_and_buffers(model: nn.Module) -> list[str]:
    """Every parameter or registered buffer still on the meta device."""
    found: list[str] = []
    for name, param in model.named_parameters():
        if param.is_meta:
            found.append(f"parameter '{name}' (not loaded from the checkpoint)")
    for name, buffer in model.named_buffers():
        if buffer is not None and buffer.is_meta:
            found.append(f"buffer '{name}' (computed in __init__)")
    return found


def guard_meta_attributes(model: nn.Module) -> list[str]:
    """Replace every plain tensor attribute on meta by an ``UnloadedTensor``;
    return their names."""
    guarded: list[str] = []
    for module_name, module in model.named_modules():
        for attribute, value in list(vars(module).items()):
            if attribute.startswith("_") or not isinstance(value, torch.Tensor) or not value.is_meta:
                continue
            if isinstance(value, UnloadedTensor):
                continue
            where = f"{module_name}.{attribute}" if module_name else attribute
            guard = torch.Tensor._make_subclass(UnloadedTensor, value)
            guard.__dict__["autoport_name"] = where
            setattr(module, attribute, guard)
            guarded.append(where)
    return guarded
