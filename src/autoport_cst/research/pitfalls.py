"""Known pitfalls of a port, derived from what the research found (the
spec, the code and checkpoint findings, the parallel plan): each one is a
consequence of a feature, never of a model name. The pitfalls of a feature
are declared by what knows it (a codemod's ``PITFALLS``, the spec sections'
``SPEC_PITFALLS``: ``autoport_cst.spec.pitfalls``); this module collects them
between what only research knows: unclassified fields and conflicts first,
the checkpoint's storage and the parallel plan last."""

from __future__ import annotations

from collections.abc import Iterable
from functools import cache
from typing import Any

from autoport_cst.research.findings import Conflict, Finding
from autoport_cst.research.parallelism import ParallelPlan
from autoport_cst.spec import ArchSpec
from autoport_cst.spec.pitfalls import SPEC_PITFALLS, Pitfall


class FoundFacts:
    """``Facts`` read from the findings: the last known value of each."""

    def __init__(self, findings: Iterable[Finding]) -> None:
        self.findings = list(findings)

    def value(self, name: str, default: Any = None) -> Any:
        found = default
        for f in self.findings:
            if f.field == name and f.known:
                found = f.value
        return found

    def unknown(self, name: str) -> bool:
        return any(f.field == name and not f.known for f in self.findings)


@cache
def declared_pitfalls() -> tuple[Pitfall, ...]:
    """Every declared pitfall, by rank: the spec sections' and each codemod's."""
    from autoport_cst.transform.library import library

    declared = [*SPEC_PITFALLS, *(p for cls in library().values() for p in cls.PITFALLS)]
    return tuple(sorted(declared, key=lambda p: p.rank))


def pitfalls(
    spec: ArchSpec,
    findings: list[Finding],
    conflicts: list[Conflict],
    unknown: list[str],
    parallel: ParallelPlan | None,
) -> list[str]:
    facts = FoundFacts(findings)
    out: list[str] = []
    if unknown:
        out.append(
            f"unclassified fields keep Llama defaults in the plan and must be checked by hand: {', '.join(unknown)}"
        )
    out.extend(f"sources disagree on {c.field}: {c.resolution}" for c in conflicts if c.severity == "error")
    for pitfall in declared_pitfalls():
        note = pitfall.note(spec, facts)
        if note is not None:
            out.append(note)
    return out + _storage_and_parallelism(facts, parallel)


def _storage_and_parallelism(facts: FoundFacts, parallel: ParallelPlan | None) -> list[str]:
    out: list[str] = []
    if facts.value("checkpoint.quantized") or facts.value("config.quantization"):
        out.append(
            "quantized checkpoint: dequantize to bf16 before loading (the parameter count from the header "
            "is not the model's)"
        )
    if facts.value("checkpoint.dtype") == "F32":
        out.append("the checkpoint stores float32 tensors: cast to bf16 when loading")
    if parallel is not None:
        notes = sorted({note for c in parallel.checks if c.tp == parallel.recommended_tp for note in c.notes})
        out.extend(notes)
        if parallel.ep_needed:
            out.append(
                "expert parallelism: one collective design per reference (EP inside the TP world), "
                "VLLM_NEURON_SWITCH_CC=1 for the 64-rank mesh"
            )
    return out
