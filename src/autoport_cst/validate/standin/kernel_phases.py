"""Which stand-in kernels ran in which phase of a validation run, and the
rule that each phase takes its own path.

A model for the vLLM Neuron backend computes a prefill call (more rows than
``decode_token_threshold``) with the context-encoding kernels and a decode
step with the token-generation ones. A port that routes prefill through the
decode path can give the same numbers on CPU (the decode kernel also
attends over the cache), but it is not the port the device runs well, nor
the one its reference describes. So the driver runs every forward inside
``phase("prefill")`` or ``phase("decode")``, each kernel calls
``record(name)`` first, and a kernel that belongs to the other phase is
refused there (``KernelPhaseError``, naming the kernel and the phase):

- prefill only: ``flash_attention``, ``segmented_attention``,
  ``segmented_attention_cp`` (context encoding);
- decode only: ``attention_decode``, ``gen_attention_decode_mask``,
  ``moe_block_tkg``, ``mla_decode_attention`` (token generation).

A hand-written kernel (a softcapped attention in plain torch) records
nothing, so the port's own methods of each phase are guarded too:
``guard_phase_methods`` wraps every module's ``forward_prefill`` /
``_forward_prefill`` and ``forward_decode`` / ``_forward_decode``, and one
called in the other phase's forward is refused the same way (a decoder
layer whose decode test is inverted sends the decode steps down its prefill
branch).

The other kernels serve both phases: projections, MLP, router, and the
blockwise ``moe_cte``, which a decode step may take too (without the fused
decode block). Outside a
phase (kernels called directly, as the tests do) nothing is refused.
``calls()`` gives the counts per phase for the report.
"""

from __future__ import annotations

import contextlib
import functools
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

PREFILL_ONLY = frozenset({"flash_attention", "segmented_attention", "segmented_attention_cp"})
DECODE_ONLY = frozenset(
    {"attention_decode", "gen_attention_decode_mask", "moe_block_tkg", "mla_decode_attention"}
)
PHASES = ("prefill", "decode")
# the port's own methods of one phase, by name (the references' convention)
PHASE_METHODS = {
    "forward_prefill": "prefill",
    "_forward_prefill": "prefill",
    "forward_decode": "decode",
    "_forward_decode": "decode",
}


class KernelPhaseError(RuntimeError):
    """A kernel of one phase ran in the other."""


@dataclass
class _State:
    phase: str | None = None
    counts: dict[str, Counter] = field(default_factory=dict)


_STATE = _State()


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """Kernels called in the block belong to phase ``name``."""
    if name not in PHASES:
        raise ValueError(f"phase must be one of {PHASES}, got {name!r}")
    previous, _STATE.phase = _STATE.phase, name
    try:
        yield
    finally:
        _STATE.phase = previous


def record(kernel: str) -> None:
    """Count a call of ``NF.<kernel>``; refuse a kernel of the other phase."""
    current = _STATE.phase
    if current is None:
        return
    _STATE.counts.setdefault(current, Counter())[kernel] += 1
    foreign = DECODE_ONLY if current == "prefill" else PREFILL_ONLY
    if kernel in foreign:
        own = PREFILL_ONLY if current == "prefill" else DECODE_ONLY
        raise KernelPhaseError(
            f"NF.{kernel} is a {_other(current)} kernel, called in a {current} forward: "
            f"{current} must take the {current} path ({', '.join(f'NF.{k}' for k in sorted(own))})"
        )


def _other(name: str) -> str:
    return PHASES[1 - PHASES.index(name)]


def calls() -> dict[str, dict[str, int]]:
    """Per phase, how many times each kernel ran (since ``reset``)."""
    return {name: dict(sorted(_STATE.counts.get(name, Counter()).items())) for name in PHASES}


def reset() -> None:
    _STATE.phase = None
    _STATE.counts = {}


def guard_phase_methods(model: Any) -> list[str]:
    """Wrap the phase methods (``PHASE_METHODS``) of every module of
    ``model`` so that one called in the other phase raises
    ``KernelPhaseError``; the qualified names of the methods guarded."""
    guarded = []
    for prefix, module in model.named_modules():
        for method, own in PHASE_METHODS.items():
            if not callable(getattr(type(module), method, None)):
                continue
            qualified = f"{prefix}.{method}" if prefix else method
            object.__setattr__(module, method, _guarded(getattr(module, method), qualified, own))
            guarded.append(qualified)
    return guarded


def _guarded(bound: Callable[..., Any], qualified: str, own: str) -> Callable[..., Any]:
    @functools.wraps(bound)
    def run(*args: Any, **kwargs: Any) -> Any:
        current = _STATE.phase
        if current is not None and current != own:
            raise KernelPhaseError(
                f"{qualified} is the {own} path of its module, called in a {current} forward: "
                f"{current} must take the {current} path"
            )
        return bound(*args, **kwargs)

    return run
