"""What the research found, as data: findings (one fact from one source, with
its evidence) and conflicts (sources that disagree about one field)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

Source = Literal["config", "code", "checkpoint", "derived"]
Confidence = Literal["certain", "inferred", "unknown"]
Severity = Literal["error", "warning"]

CONFIG: Source = "config"
CODE: Source = "code"
CHECKPOINT: Source = "checkpoint"
DERIVED: Source = "derived"

CERTAIN: Confidence = "certain"
INFERRED: Confidence = "inferred"
UNKNOWN_CONFIDENCE: Confidence = "unknown"


@dataclass(frozen=True)
class Finding:
    """One fact. ``field`` is a dotted spec path (``attention.qkv_bias``) or,
    for facts the spec has no field for, a name under the source
    (``checkpoint.fused_qkv``, ``code.qkv_layout``). ``confidence`` is
    ``unknown`` when the source could not classify the field; ``value`` is
    then ``None`` and ``evidence`` says what was seen."""

    field: str
    value: Any
    source: Source
    evidence: str
    confidence: Confidence = CERTAIN

    @property
    def known(self) -> bool:
        return self.confidence != UNKNOWN_CONFIDENCE


@dataclass(frozen=True)
class Claim:
    source: Source
    value: Any
    evidence: str


@dataclass(frozen=True)
class Conflict:
    """Sources that disagree about one field, and which value the spec took."""

    field: str
    claims: tuple[Claim, ...]
    resolution: str
    severity: Severity = "error"


def known(value: Any, field: str, source: Source, evidence: str, confidence: Confidence = CERTAIN) -> Finding:
    return Finding(field, value, source, evidence, confidence)


def unknown(field: str, source: Source, evidence: str) -> Finding:
    return Finding(field, None, source, evidence, UNKNOWN_CONFIDENCE)


class FindingSet:
    """Findings by field, in the order they were added (deterministic)."""

    def __init__(self, findings: Iterable[Finding] = ()) -> None:
        self._items: list[Finding] = []
        for finding in findings:
            self.add(finding)

    def add(self, finding: Finding) -> Finding:
        self._items.append(finding)
        return finding

    def extend(self, findings: Iterable[Finding]) -> None:
        for finding in findings:
            self.add(finding)

    def get(self, field: str, source: Source | None = None) -> Finding | None:
        for finding in reversed(self._items):
            if finding.field == field and (source is None or finding.source == source):
                return finding
        return None

    def value(self, field: str, default: Any = None, source: Source | None = None) -> Any:
        finding = self.get(field, source)
        if finding is None or not finding.known:
            return default
        return finding.value

    def __iter__(self):
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def as_tuple(self) -> tuple[Finding, ...]:
        return tuple(self._items)
