"""Teacher-forced expert routing: the evidence that lets a bf16 MoE port
whose free-routing comparison fails validate (docs/validation.md,
"MoE routing near-ties").

A router's top-k is a discrete choice. Where the float32 golden run's k-th
and (k+1)-th scores are closer than bf16 rounding can move them, a bf16 run
(the port's, or transformers' own) may pick another expert for that token,
and the token's MoE output then differs by the order of the output itself.
So, when the free comparison fails, both sides run again with every MoE
layer taking the golden run's expert choice for every token
(``routing.RoutingMode``):

- the **teacher-forced comparison**: the port, forced, against transformers
  in bf16, forced, with every gate unchanged;
- the **routing divergences**: the tokens where the port, on the forced
  trajectory, chose other experts than the golden run (its own top-k,
  recorded before forcing): each is where a free-routing divergence starts;
- the **bf16 resolution** of each MoE layer's ranking: the largest change
  that bf16 rounding made, in transformers' own forced bf16 run, to the gap
  between two experts' scores of a token. A divergence is a **near tie**
  when the golden margin (k-th minus (k+1)-th score) is below that
  resolution times the R-ratio tolerance (the port's error may be that much
  larger than transformers' bf16 error).

The port validates when the teacher-forced comparison passes every gate and
every routing divergence is a near tie. A router that computes the wrong
scores, the wrong top-k, no renormalisation or no routing bias fails: the
first three change what the forced experts are weighted with (or, with
another k, are not forced at all), a dropped routing bias changes the choice
itself at tokens whose margin is clear.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import compare
from .driver import PortOutput
from .metrics import R_RATIO_TOLERANCE
from .reference import ReferenceOutput
from .routing import ForcedTeacher, RoutedRun, RoutingRecord, Token
from .scenario import Scenario

MAX_LISTED = 20  # routing divergences listed in a report


@dataclass
class RoutingDivergence:
    """A token where the port's own expert choice differs from the golden one."""

    component: str
    phase: str
    sequence: int
    position: int
    golden: list[int]
    port: list[int]
    margin: float
    resolution: float

    @property
    def near_tie(self) -> bool:
        return self.margin < self.resolution * R_RATIO_TOLERANCE


@dataclass
class ForcedRoutingEvidence:
    """The teacher-forced comparison and the routing divergences."""

    comparison: compare.Comparison | None
    divergences: list[RoutingDivergence] = field(default_factory=list)
    resolution: dict[str, float] = field(default_factory=dict)
    transformers_flips: int = 0
    unforced: set[str] = field(default_factory=set)  # the port's top-k calls with another k
    unavailable: str | None = None

    @property
    def validates(self) -> bool:
        return (
            self.unavailable is None
            and self.comparison is not None
            and self.comparison.equivalent
            and all(d.near_tie for d in self.divergences)
        )

    def describe(self, free_failed: list[str]) -> dict[str, Any]:
        """The report's ``routing`` entry."""
        if self.unavailable is not None:
            return {"teacher_forced": {"unavailable": self.unavailable}}
        assert self.comparison is not None
        clear = [d for d in self.divergences if not d.near_tie]
        return {
            "used": "teacher_forced" if self.validates else "free",
            "free_routing": {"failed_checks": free_failed},
            "teacher_forced": {
                "equivalent": self.comparison.equivalent,
                "failed_checks": self.comparison.failed,
            },
            "resolution": {name: round(value, 6) for name, value in self.resolution.items()},
            "resolution_factor": R_RATIO_TOLERANCE,
            "near_ties": [vars(d) for d in self.divergences if d.near_tie][:MAX_LISTED],
            "clear_divergences": [vars(d) for d in clear][:MAX_LISTED],
            "divergences": len(self.divergences),
            "transformers_bf16_flips": self.transformers_flips,
            "unforced_calls": sorted(self.unforced),
        }

    def summary(self) -> str:
        """Why the evidence does not validate the port (or what it shows)."""
        if self.unavailable is not None:
            return f"no teacher-forced routing comparison: {self.unavailable}"
        assert self.comparison is not None
        clear = [d for d in self.divergences if not d.near_tie]
        if not self.comparison.equivalent:
            first = self.comparison.first
            return "with teacher-forced routing, " + (
                first.message if first else ", ".join(self.comparison.failed)
            )
        if clear:
            d = clear[0]
            return (
                f"{len(clear)} routing divergence(s) at clear expert choices; first: {d.component} "
                f"({d.phase}) sequence {d.sequence} position {d.position}: the port chose {d.port}, the "
                f"float32 golden run {d.golden} (margin {d.margin:.3g}, bf16 resolution {d.resolution:.3g})"
            )
        return f"teacher-forced routing validates; {len(self.divergences)} routing near-tie(s)"


def resolutions(golden: RoutingRecord, bf16: RoutingRecord) -> dict[str, float]:
    """Per MoE component: the largest change bf16 rounding made to the gap
    between two experts' scores of one token (transformers' forced bf16 run
    against the golden float32 run)."""
    found = {}
    for component, scores in golden.scores.items():
        worst = 0.0
        for token, s32 in scores.items():
            s16 = bf16.scores.get(component, {}).get(token)
            if s16 is not None:
                change = s16.double() - s32.double()
                worst = max(worst, float(change.max() - change.min()))
        found[component] = worst
    return found


def divergences(
    golden: RoutingRecord, own: RoutingRecord, resolution: dict[str, float], scenario: Scenario
) -> list[RoutingDivergence]:
    """The tokens whose own expert set is not the golden one, in data-flow
    order (component, then sequence and position)."""
    found = []
    for component, choices in golden.choices.items():
        for token in sorted(choices):
            mine = own.choices.get(component, {}).get(token)
            if mine is None or set(mine) == set(choices[token]):
                continue
            found.append(
                RoutingDivergence(
                    component,
                    _phase(token, scenario),
                    token[0],
                    token[1],
                    sorted(choices[token]),
                    sorted(mine),
                    golden.margin(component, token),
                    resolution.get(component, 0.0),
                )
            )
    return found


def _phase(token: Token, scenario: Scenario) -> str:
    return "prefill" if token[1] < len(scenario.prompts[token[0]]) else "decode"


def flips(golden: RoutingRecord, other: RoutingRecord) -> int:
    """How many tokens ``other`` routed to another expert set than golden."""
    return sum(
        1
        for component, choices in golden.choices.items()
        for token, chosen in choices.items()
        if token in other.choices.get(component, {}) and set(other.choices[component][token]) != set(chosen)
    )


def teacher_forced(
    run_port: Callable[[ForcedTeacher], PortOutput],
    reference: Callable[[RoutingRecord | None, bool], tuple[ReferenceOutput, RoutedRun]],
    scenario: Scenario,
    teacher: list[list[int]],
    experts: int,
) -> ForcedRoutingEvidence:
    """Run the golden float32 reference (recording its choices), transformers
    in bf16 and the port with those choices forced, and compare.
    ``reference(forced, bf16)`` runs transformers; ``run_port`` the port."""
    ref32, golden = reference(None, False)
    if not golden.record.choices:
        return ForcedRoutingEvidence(None, unavailable="no MoE top-k over the experts ran in transformers")
    ref16, forced16 = reference(golden.record, True)
    port = run_port(ForcedTeacher(teacher, golden.record, experts))
    own = port.routing
    if own is None or not own.record.choices:
        return ForcedRoutingEvidence(None, unavailable="no MoE top-k over the experts ran in the port")
    if own.unmapped:
        return ForcedRoutingEvidence(
            None, unavailable="router calls whose rows are not the tokens: " + "; ".join(sorted(own.unmapped))
        )
    comparison = compare.compare_all(port, ref32, ref16, scenario, teacher, "bf16")
    resolution = resolutions(golden.record, forced16.record)
    return ForcedRoutingEvidence(
        comparison,
        divergences(golden.record, own.record, resolution, scenario),
        resolution,
        flips(golden.record, forced16.record),
        own.unforced,
    )
