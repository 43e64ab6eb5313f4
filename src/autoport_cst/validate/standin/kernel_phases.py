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
  ``moe_block_tkg`` (token generation).

The other kernels serve both phases: projections, MLP, router, and the
blockwise ``moe_cte``, which a decode step may take too (without the fused
decode block). Outside a
phase (kernels called directly, as the tests do) nothing is refused.
``calls()`` gives the counts per phase for the report.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

PREFILL_ONLY = frozenset({"flash_attention", "segmented_attention", "segmented_attention_cp"})
DECODE_ONLY = frozenset({"attention_decode", "gen_attention_decode_mask", "moe_block_tkg"})
PHASES = ("prefill", "decode")


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
