"""The state every spec decider shares: the findings of the three sources
(config, code, checkpoint) and what the decision collects (the finding each
spec value came from, conflicts, unknown fields, notes), with the lookups
that decide a field from them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from autoport_cst.research.analysis.state import CodeAnalysis
from autoport_cst.research.checkpoint import CheckpointHeader
from autoport_cst.research.config_analysis import ConfigAnalysis
from autoport_cst.research.findings import (
    CODE,
    CONFIG,
    DERIVED,
    Claim,
    Conflict,
    Finding,
    Severity,
    Source,
    unknown,
)


class Decider:
    """One decision: the sources, and the decisions, conflicts, unknowns and
    notes collected in the order the sections ask."""

    def __init__(
        self,
        cfg: ConfigAnalysis,
        code: CodeAnalysis | None,
        ckpt: CheckpointHeader | None,
        ckpt_findings: list[Finding],
    ) -> None:
        self.cfg = cfg
        self.code = code
        self.ckpt = ckpt
        self.ckpt_findings = ckpt_findings
        self.decisions: list[Finding] = []
        self.conflicts: list[Conflict] = []
        self.unknown: list[str] = []
        self.notes: list[Finding] = []
        # routed experts found one tensor per expert in the header (None: not looked up)
        self.experts_per_expert: bool | None = None

    def code_finding(self, name: str) -> Finding | None:
        return self.code.get(name) if self.code is not None else None

    def code_value(self, name: str) -> Any:
        finding = self.code_finding(name)
        if finding is not None and finding.known:
            self.decisions.append(finding)
            return finding.value
        return None

    def cfg_finding(self, name: str) -> Finding | None:
        return self.cfg.get(name)

    def ckpt_finding(self, name: str) -> Finding | None:
        for finding in reversed(self.ckpt_findings):
            if finding.field == name:
                return finding
        return None

    def decide(self, name: str, default: Any, order: tuple[str, ...] = (CODE, CONFIG)) -> Any:
        """The value of spec field ``name`` from the first source (in
        ``order``) that classified it; the default and an unknown mark
        otherwise."""
        seen: list[Finding] = []
        for source in order:
            finding = self.code_finding(name) if source == CODE else self.cfg_finding(name)
            if finding is None:
                continue
            seen.append(finding)
            if finding.known:
                self.decisions.append(finding)
                return finding.value
        evidence = "; ".join(f"{f.source}: {f.evidence}" for f in seen) or "no source describes it"
        self.decisions.append(unknown(name, DERIVED, f"{evidence} (spec keeps the default {default!r})"))
        self.unknown.append(name)
        return default

    def flag(self, name: str, default: Any) -> Any:
        """A field only the code analysis reports, and only when it sees the
        feature: its finding, else the default (absent), without an unknown."""
        finding = self.code_finding(name)
        if finding is not None and finding.known:
            self.decisions.append(finding)
            return tuple(finding.value) if isinstance(finding.value, list) else finding.value
        return default

    def value(self, name: str, default: Any = None) -> Any:
        finding = self.cfg_finding(name)
        if finding is not None and finding.known:
            self.decisions.append(finding)
            return finding.value
        return default

    def conflict(
        self,
        field: str,
        claims: Sequence[tuple[Source, Any, str]],
        resolution: str,
        severity: Severity = "error",
    ) -> None:
        self.conflicts.append(
            Conflict(field, tuple(Claim(s, v, e) for s, v, e in claims), resolution, severity)
        )
