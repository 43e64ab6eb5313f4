"""What a vision-language model's vision tower computes, read from transformers'
modules built (on the meta device) from the checkpoint's configuration.

Each field of the spec's ``vision`` section is read from the module tree or
from a small computation of one of its modules copied to the CPU, never from
the model's name: the norms' arithmetic (mean subtracted or not), the
activation's values on a test input, the MLP's projections (gated: two read
the block input), the patch embedding's bias, a learned position table beside
the rotary one, the merger's norm and activation, window attention (the
tower's forward gives some blocks other sequence bounds, read from its
source), and the decoder's M-RoPE layout (which rotary frequencies the
temporal position moves).
"""

from __future__ import annotations

import copy
import inspect
import re
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from autoport_cst.research.findings import CODE, CONFIG, Finding, known, unknown

# the activations the spec names, as the values they compute
_ACTIVATIONS = {
    "gelu": lambda x: torch.nn.functional.gelu(x),
    "gelu_tanh": lambda x: torch.nn.functional.gelu(x, approximate="tanh"),
    "silu": torch.nn.functional.silu,
    "quick_gelu": lambda x: x * torch.sigmoid(1.702 * x),
    "relu": torch.relu,
}


def on_cpu(module: nn.Module) -> nn.Module:
    """A CPU copy of a (meta) module with unit weights and zero biases."""
    clone = copy.deepcopy(module).to_empty(device="cpu")
    with torch.no_grad():
        for name, p in clone.named_parameters():
            p.fill_(0.0 if name.endswith("bias") else 1.0)
    return clone


def norm_kind(module: nn.Module) -> str | None:
    """layernorm when the output of a shifted ramp has (about) zero mean,
    rmsnorm when it keeps the input's sign, else None."""
    width = next(module.parameters()).shape[0]
    x = torch.arange(width, dtype=torch.float32).reshape(1, width) + 5.0
    try:
        with torch.no_grad():
            y = on_cpu(module)(x)
    except Exception:
        return None
    if abs(float(y.mean())) < 1e-3:
        return "layernorm"
    if bool((y > 0).all()) and torch.allclose(y, x / x.pow(2).mean().sqrt(), rtol=1e-3, atol=1e-4):
        return "rmsnorm"
    return None


def activation_of(fn: Any) -> str | None:
    """The spec's name of the activation ``fn`` computes."""
    x = torch.linspace(-4.0, 4.0, 41)
    try:
        with torch.no_grad():
            y = fn(x)
    except Exception:
        return None
    for name, ref in _ACTIVATIONS.items():
        if torch.allclose(y, ref(x), atol=1e-6):
            return name
    return None


def linears(module: nn.Module) -> list[tuple[str, nn.Linear]]:
    return [(n, m) for n, m in module.named_children() if isinstance(m, nn.Linear)]


def norms(module: nn.Module) -> list[tuple[str, nn.Module]]:
    """Children with one weight vector (and maybe a bias) and no children: norms."""
    found = []
    for name, child in module.named_children():
        params = dict(child.named_parameters(recurse=False))
        weight = params.get("weight")
        if not list(child.children()) and weight is not None and weight.dim() == 1:
            found.append((name, child))
    return found


def callables(module: nn.Module) -> Iterator[tuple[str, Any]]:
    """Attributes of ``module`` that compute without parameters (activations)."""
    for name, value in vars(module).items():
        if name.startswith("_"):
            continue
        if callable(value) and not isinstance(value, (nn.Module, type)):
            yield name, value
    for name, child in module.named_modules():
        if name and not list(child.parameters()) and not list(child.children()):
            yield name, child


def block_list(tower: nn.Module, depth: int | None) -> tuple[str, nn.ModuleList] | None:
    """The tower's list of transformer blocks: a ModuleList of modules each with
    a norm, an attention with a fused QKV and an MLP."""
    for name, child in tower.named_children():
        if isinstance(child, nn.ModuleList) and len(child) and (depth is None or len(child) == depth):
            if len(norms(child[0])) >= 2:
                return name, child
    return None


def source_of(fn: Any) -> str:
    try:
        return inspect.getsource(fn)
    except (OSError, TypeError):
        return ""


def window_attention(tower: nn.Module, depth: int) -> tuple[str, tuple[int, ...] | None, Finding]:
    """window when the tower's forward hands the blocks whose index is in a
    list attribute other sequence bounds than the rest (a window index
    computed from ``self.window_size``); full otherwise."""
    src = source_of(type(tower).forward)
    where = f"{type(tower).__name__}.forward"
    member = re.search(r"\bin self\.(\w+)", src)
    if "self.window_size" in src and member is not None:
        full = tuple(int(i) for i in getattr(tower, member.group(1), ()) or ())
        if len(full) < depth:
            evidence = (
                f"{where}: blocks not in self.{member.group(1)} {list(full)} attend within windows of "
                f"self.window_size = {getattr(tower, 'window_size', None)}"
            )
            return "window", full, known("window", "vision.attention", CODE, evidence)
    evidence = f"{where}: every block attends over the whole image (no window index)"
    return "full", None, known("full", "vision.attention", CODE, evidence)


def mrope_layout(rotary: nn.Module, head_dim: int) -> tuple[bool | None, Finding]:
    """Interleaved when the temporal position moves the frequencies 0, 3, 6, ...
    of the decoder's rotary table; consecutive sections when it moves 0..s-1."""
    name = type(rotary).__name__
    try:
        cpu = type(rotary)(rotary.config)  # built again on the CPU: its tables computed, not empty
        pos = torch.zeros(3, 1, 1, dtype=torch.long)
        pos[0] = 1
        x = torch.zeros(1, 1, head_dim)
        with torch.no_grad():
            cos, _ = cpu(x, pos)
    except Exception as exc:
        return None, unknown("vision.mrope_interleaved", CODE, f"{name}: the probe failed: {exc}")
    moved = [i for i, c in enumerate(cos.reshape(-1)[: head_dim // 2].tolist()) if abs(c - 1.0) > 1e-9]
    if len(moved) > 1 and moved[1] - moved[0] == 3:
        evidence = f"{name}: the temporal position moves frequencies {moved[:4]}... (every third)"
        return True, known(True, "vision.mrope_interleaved", CODE, evidence)
    if moved and moved == list(range(len(moved))):
        evidence = f"{name}: the temporal position moves frequencies 0..{len(moved) - 1} (one section)"
        return False, known(False, "vision.mrope_interleaved", CODE, evidence)
    return None, unknown("vision.mrope_interleaved", CODE, f"{name}: temporal frequencies {moved}")


def config_value(vision_cfg: Any, field: str, key: str) -> tuple[Any, Finding]:
    value = getattr(vision_cfg, key, None)
    if value is None:
        return None, unknown(field, CONFIG, f"vision_config has no {key}")
    if isinstance(value, list):
        value = tuple(value)
    return value, known(value, field, CONFIG, f"vision_config.{key} = {value}")
