"""Kernel calls that compute below the precision of their inputs, as the
port asked: an MoE kernel given ``compute_dtype=nl.bfloat16`` in a float32
model (the real vllm_neuron qwen3_moe's prefill experts) computes its expert
matmuls in bf16 on the device, and so does the stand-in. A float32
validation of such a port cannot hold that component to float32's
tolerances; the validator reads these notes to say so
(``validate.fixed_precision``).

Each note names the kernel, the two dtypes, the port's call site (the first
frame outside the stand-in) and the modules whose code is on the stack at the
call (innermost first, by ``id``: the driver maps them to module paths).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import torch

_STAND_IN = str(Path(__file__).resolve().parent)
_NOTES: list[Narrowed] = []


@dataclass(frozen=True)
class Narrowed:
    kernel: str  # "NF.moe_cte"
    compute: str  # the dtype it computes in: "bfloat16"
    given: str  # its input's dtype: "float32"
    site: str  # the port's call: "model.py:1218"
    module_ids: tuple[int, ...]  # nn.Modules on the stack at the call, innermost first


def note(kernel: str, compute: torch.dtype, given: torch.dtype) -> None:
    """Record a call of ``kernel`` that computes in ``compute`` on inputs in
    ``given``, when ``compute`` is the narrower of the two."""
    if not (compute.is_floating_point and given.is_floating_point):
        return
    if torch.finfo(compute).bits >= torch.finfo(given).bits:
        return
    site, modules = "", []
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        path = frame.f_code.co_filename
        if not site and not str(Path(path).resolve()).startswith(_STAND_IN):
            site = f"{Path(path).name}:{frame.f_lineno}"
        owner = frame.f_locals.get("self")
        if site and isinstance(owner, torch.nn.Module) and id(owner) not in modules:
            modules.append(id(owner))
        frame = frame.f_back
    _NOTES.append(Narrowed(kernel, _name(compute), _name(given), site, tuple(modules)))


def taken() -> list[Narrowed]:
    """The notes since the last call, removed."""
    found = list(_NOTES)
    _NOTES.clear()
    return found


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
