"""The validation report: a versioned JSON document with a published JSON
Schema (``REPORT_SCHEMA``; print it with ``report_schema_json()``)."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .compare import Comparison

REPORT_KIND = "autoport-cst/validation-report"
REPORT_VERSION = 1


@dataclass
class PortFailureInfo:
    """The port crashed or broke a hardware rule at ``stage``; ``refusal``:
    it raised NotImplementedError from its own code (``PortFailure.refusal``);
    ``raised_in``: the function of the port's code the error came from
    (``PortFailure.raised_in``), or None."""

    stage: str
    message: str
    refusal: bool = False
    raised_in: str | None = None


def fail_at_check(report: Any, check: str, messages: list[str]) -> None:
    """Fail ``report`` at the run-time check ``check`` (the sequence-parallel
    length check, the rank-less forward, the kernel substitutes): each message
    a failed check, the first the report's failure unless one is set."""
    if not messages:
        return
    report.equivalent = False
    report.failed_checks = [*report.failed_checks, *(f"{check}: {message}" for message in messages)]
    if report.failure is None:
        report.failure = PortFailureInfo(check, messages[0])


def record_check(report: Any, check: str, setting: str, entries: list[dict[str, Any]] | None) -> None:
    """A run-time check's entries (``{"passed", "message"}``; None: not asked)
    into ``report``: ``settings[setting]`` lists what was asked, and the first
    failing entry fails the report at ``check``."""
    if entries is None:
        return
    report.settings[setting] = [entry["message"] for entry in entries]
    fail_at_check(report, check, [entry["message"] for entry in entries if not entry["passed"]][:1])


@dataclass
class Divergence:
    """The first check that failed, in data-flow order."""

    component: str
    phase: str | None
    metric: str
    value: float | None
    tolerance: float | None
    message: str


@dataclass
class ValidationReport:
    model_dir: str
    checkpoint_dir: str
    architecture: str | None
    factory: str | None
    settings: dict[str, Any]
    equivalent: bool
    first_diverging: Divergence | None = None
    failed_checks: list[str] = field(default_factory=list)
    failure: PortFailureInfo | None = None
    logits: dict[str, Any] | None = None
    components: list[dict[str, Any]] = field(default_factory=list)
    not_compared: list[str] = field(default_factory=list)
    unused_checkpoint_keys: list[str] = field(default_factory=list)
    tolerances: dict[str, Any] = field(default_factory=dict)
    environment: dict[str, Any] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    # bf16 only: the transformers bf16 baseline the verdict used ("eager", or "kernel_precision"
    # when the port fails against eager and passes against transformers at the kernels' precision)
    bf16_baseline: dict[str, Any] | None = None
    # bf16 MoE ports whose free-routing comparison failed: the teacher-forced routing comparison
    # (docs/validation.md, "MoE routing near-ties"): "used": "teacher_forced" when it validated the port
    routing: dict[str, Any] | None = None
    # fp32 runs that failed where the port's own kernel call computes in a narrower dtype
    # (validate.fixed_precision): the calls, the fp32 finding and the bf16 gates' verdict
    precision: dict[str, Any] | None = None
    # an FP8 KV-cache run in fp32: the transformers cache teacher-forced from the port's stored K/V
    # (validate.fp8_cache_forcing): elements stored, rounded_apart (taken), differing (not taken)
    kv_cache: dict[str, Any] | None = None
    # the config variants the port's reference declares (validate.config_variants), each run at TP=1
    # in fp32 on a checkpoint of its own: label, equivalent (None: not run) and summary
    config_variants: list[dict[str, Any]] = field(default_factory=list)
    # the parallel layouts a passing TP=1 fp32 run goes on to (validate.parallel_checks), each in
    # fp32 on the same checkpoint: label, equivalent (None: not run) and summary
    parallel_layouts: list[dict[str, Any]] = field(default_factory=list)
    # float fields of config.json that transformers never read and the port's config holds
    # (validate.unread_fields): a follow-up run sets each far from its value
    unread_config_fields: dict[str, float] = field(default_factory=dict)
    # the findings of autoport-cst's lint rules on the port package, checked before it runs
    # (validate.lint_gate): an error fails the report at stage "lint"; warnings do not
    lint: list[dict[str, Any]] = field(default_factory=list)
    version: int = REPORT_VERSION
    kind: str = REPORT_KIND
    # In memory only (not in the JSON report): the port's logits and component
    # outputs (a PortOutput), for callers that compare runs (e.g. TP=1 vs TP=2).
    port_output: Any = field(default=None, repr=False, compare=False)

    @property
    def exit_code(self) -> int:
        return 0 if self.equivalent else 1

    def take_comparison(self, comparison: Comparison) -> None:
        """The verdict, divergence, failed checks and metrics of ``comparison``."""
        self.equivalent = comparison.equivalent
        self.first_diverging = comparison.first
        self.failed_checks = list(comparison.failed)
        self.components = [vars(c) for c in comparison.components]
        self.not_compared = list(comparison.not_compared)
        self.logits = vars(comparison.logits)

    def summary(self) -> str:
        if self.equivalent:
            baseline = self.bf16_baseline or {}
            if baseline.get("used") == "kernel_precision":
                return (
                    "equivalent within tolerances against transformers at the kernels' precision policy "
                    "(not against eager bf16: " + ", ".join(baseline["eager"]["failed_checks"]) + ")"
                )
            precision = self.precision or {}
            if precision.get("bf16_gates", {}).get("equivalent"):
                return (
                    "equivalent within the bf16 gates, not float32's: the port computes "
                    + describe_narrowed(precision)
                    + f" (at float32: {precision['fp32']['first_diverging']})"
                )
            routing = self.routing or {}
            if routing.get("used") == "teacher_forced":
                return "equivalent within tolerances with expert routing " + _teacher_forced(routing)
            return "equivalent within tolerances"
        if self.failure is not None and self.failure.stage == "lint":  # validate.lint_gate: not run
            return f"does not validate: {self.failure.message}"
        if self.failure is not None:
            return f"not equivalent: the port failed at {self.failure.stage}: {self.failure.message}"
        if self.first_diverging is not None:
            forced = (self.routing or {}).get("summary")
            return f"not equivalent: {self.first_diverging.message}" + (f"; {forced}" if forced else "")
        return "not equivalent: " + ", ".join(self.failed_checks)

    def fail_as(self, named: str, found: ValidationReport) -> None:
        """This report fails as ``found`` (a run of the same port on another
        checkpoint or layout) failed, each of its findings prefixed ``named``."""
        self.equivalent = False
        self.failed_checks = [f"{named}: {check}" for check in found.failed_checks]
        if found.failure is not None:
            self.failure = PortFailureInfo(f"{named}: {found.failure.stage}", found.failure.message)
        elif found.first_diverging is not None:
            first = found.first_diverging
            self.first_diverging = Divergence(**{**vars(first), "message": f"{named}: {first.message}"})

    def to_dict(self) -> dict[str, Any]:
        data = _plain({f.name: getattr(self, f.name) for f in fields(self) if f.name != "port_output"})
        ordered = {"kind": data.pop("kind"), "version": data.pop("version")}
        ordered.update(data)
        return ordered

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, allow_nan=False) + "\n"


def _teacher_forced(routing: dict[str, Any]) -> str:
    ties = ", ".join(
        f"{t['component']} ({t['phase']}) sequence {t['sequence']} position {t['position']}"
        for t in routing["near_ties"]
    )
    return (
        f"teacher-forced from the float32 run; free routing diverges at {routing['divergences']} "
        f"near-tie token(s): {ties} (not equivalent with free routing: "
        + ", ".join(routing["free_routing"]["failed_checks"])
        + ")"
    )


def _plain(value: Any) -> Any:
    """JSON-safe copy: non-finite floats become null, tuples lists."""
    if is_dataclass(value) and not isinstance(value, type):
        value = asdict(value)
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


_NUMBER = {"type": ["number", "null"]}
_COMPONENT = {
    "type": "object",
    "required": ["name", "phase", "module", "rows", "rel_error", "r_ratio", "gate", "tolerance", "passed"],
    "properties": {
        "name": {"type": "string"},
        "phase": {"enum": ["prefill", "decode"]},
        "module": {"type": "string"},
        "rows": {"type": "integer", "minimum": 0},
        "rel_error": _NUMBER,
        "max_abs_error": _NUMBER,
        "cosine_min": _NUMBER,
        "r_ratio": _NUMBER,
        "gate": {"enum": ["rel_error", "r_ratio"]},
        "tolerance": {"type": "number"},
        "passed": {"type": "boolean"},
        "note": {"type": ["string", "null"]},
        "compared_columns": {"type": ["string", "null"]},
    },
}
_LOGITS = {
    "type": ["object", "null"],
    "required": [
        "tokens",
        "tokens_passed",
        "topk_max_error",
        "max_abs_error",
        "max_rel_error",
        "cosine_p5",
        "kl_mean",
        "top1_agreement",
        "greedy_match",
        "gates",
    ],
    "properties": {
        "tokens": {"type": "integer", "minimum": 0},
        "tokens_passed": {"type": "integer", "minimum": 0},
        "labels": {"type": "object", "additionalProperties": {"type": "integer"}},
        "topk_max_error": {"type": "object", "additionalProperties": _NUMBER},
        "topk_rtol": {"type": "object", "additionalProperties": {"type": "number"}},
        "topk_passed": {"type": "object", "additionalProperties": {"type": "boolean"}},
        "max_abs_error": _NUMBER,
        "max_rel_error": _NUMBER,
        "rel_error": _NUMBER,
        "cosine_min": _NUMBER,
        "cosine_p5": _NUMBER,
        "cosine_fraction_below": _NUMBER,
        "kl_mean": _NUMBER,
        "kl_p95": _NUMBER,
        "kl_max": _NUMBER,
        "top1_agreement": _NUMBER,
        "greedy_match": _NUMBER,
        "greedy_first_mismatch": {"type": "array", "items": {"type": ["integer", "null"]}},
        "sigma_ratio": _NUMBER,
        "bhattacharyya": _NUMBER,
        "linf_ratio_max": _NUMBER,
        "l2_ratio_max": _NUMBER,
        "token_linf_ratio_max": _NUMBER,
        "token_l2_ratio_max": _NUMBER,
        "first_failing_token": {"type": ["object", "null"]},
        "gates": {"type": "object", "additionalProperties": {"type": "boolean"}},
    },
}

_ROUTING_TOKEN = {
    "type": "object",
    "required": ["component", "phase", "sequence", "position", "golden", "port", "margin", "resolution"],
    "properties": {
        "component": {"type": "string"},
        "phase": {"enum": ["prefill", "decode"]},
        "sequence": {"type": "integer"},
        "position": {"type": "integer"},
        "golden": {"type": "array", "items": {"type": "integer"}},
        "port": {"type": "array", "items": {"type": "integer"}},
        "margin": _NUMBER,
        "resolution": _NUMBER,
    },
}
_ROUTING = {
    "type": ["object", "null"],
    "description": "bf16 MoE ports that fail with free routing: the comparison with every expert choice "
    "teacher-forced from the float32 run, and the tokens where the port's own choice differs",
    "properties": {
        "used": {"enum": ["teacher_forced", "free"]},
        "summary": {"type": "string"},
        "free_routing": {"type": "object"},
        "teacher_forced": {"type": "object"},
        "resolution": {"type": "object", "additionalProperties": {"type": "number"}},
        "resolution_factor": {"type": "number"},
        "near_ties": {"type": "array", "items": _ROUTING_TOKEN},
        "clear_divergences": {"type": "array", "items": _ROUTING_TOKEN},
        "divergences": {"type": "integer", "minimum": 0},
        "transformers_bf16_flips": {"type": "integer", "minimum": 0},
        "unforced_calls": {"type": "array", "items": {"type": "string"}},
    },
}

_KV_CACHE = {
    "type": ["object", "null"],
    "description": "an FP8 KV-cache run in fp32: the transformers cache teacher-forced from the port's "
    "stored K/V, taking the port's value where it is transformers' rounding or the other FP8 neighbour "
    "of a value within the fp32 gate's reach of their rounding boundary",
    "properties": {
        "teacher_forced": {"type": "boolean"},
        "elements": {"type": "integer", "minimum": 0},
        "rounded_apart": {"type": "integer", "minimum": 0},
        "differing": {"type": "integer", "minimum": 0},
        "unmatched_layers": {"type": "array", "items": {"type": "integer"}},
    },
}

_LABELLED_RUNS = {
    "type": "array",
    "items": {
        "type": "object",
        "required": ["label", "equivalent", "summary"],
        "properties": {
            "label": {"type": "string"},
            "equivalent": {"type": ["boolean", "null"]},
            "summary": {"type": ["string", "null"]},
        },
    },
}

_LINT_FINDING = {
    "type": "object",
    "required": ["path", "line", "column", "code", "name", "severity", "message", "fix"],
    "properties": {
        "path": {"type": "string"},
        "line": {"type": "integer", "minimum": 1},
        "column": {"type": "integer", "minimum": 1},
        "end_line": {"type": "integer"},
        "end_column": {"type": "integer"},
        "code": {"type": "string"},
        "name": {"type": "string"},
        "severity": {"enum": ["error", "warning"]},
        "message": {"type": "string"},
        "fix": {
            "type": ["object", "null"],
            "description": "the codemod `autoport-cst lint --fix` runs (safe: false needs --unsafe-fixes)",
            "properties": {"codemod": {"type": "string"}, "safe": {"type": "boolean"}},
        },
        "note": {"type": ["string", "null"]},
    },
}

REPORT_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "https://autoport-cst/schemas/validation-report-1.json",
    "title": "autoport-cst validation report",
    "description": "A port run on CPU against transformers on the same checkpoint "
    "(docs/validation.md defines every metric and tolerance).",
    "type": "object",
    "required": [
        "kind",
        "version",
        "model_dir",
        "checkpoint_dir",
        "settings",
        "equivalent",
        "first_diverging",
        "failed_checks",
        "failure",
        "logits",
        "components",
    ],
    "properties": {
        "kind": {"const": REPORT_KIND},
        "version": {"const": REPORT_VERSION},
        "model_dir": {"type": "string"},
        "checkpoint_dir": {"type": "string"},
        "architecture": {"type": ["string", "null"]},
        "factory": {"type": ["string", "null"]},
        "settings": {
            "type": "object",
            "required": ["tp", "dtype", "steps", "prompt_lengths"],
            "properties": {
                "tp": {"type": "integer", "minimum": 1},
                "ep": {"type": "integer", "minimum": 1},
                "dtype": {"enum": ["fp32", "bf16"]},
                "steps": {"type": "integer", "minimum": 1},
                "prompt_lengths": {"type": "array", "items": {"type": "integer", "minimum": 1}},
                "block_size": {"type": "integer"},
                "blocks_per_seq": {"type": "integer"},
                "seed": {"type": "integer"},
                "prefill": {"enum": ["auto", "segmented", "off"]},
                "kv_cache_dtype": {"enum": ["auto", "fp8"]},
                "decode_tokens": {
                    "type": "integer",
                    "minimum": 2,
                    "description": "new tokens per sequence in each decode call (speculative decoding)",
                },
                "prefill_calls": {"type": "array", "items": {"type": "object"}},
                "prefill_length_check": {
                    "type": "array",
                    "items": {"type": "string"},
                    "description": "the sequence-parallel prefill-length refusals asked of a TP > 1 run",
                },
                "rankless_check": {
                    "type": "array",
                    "items": {"type": "string"},
                    "description": "the decode step repeated without rank in a run with embedding DP > 1",
                },
                "kernel_substitutes": {
                    "type": "string",
                    "description": "the port's op-by-op attention substitutes were run beside the kernels",
                },
                "layout": {
                    "type": "object",
                    "description": "data / context parallelism of a disaggregated run (docs/validation.md)",
                    "required": [
                        "tp",
                        "dp",
                        "attention_dp",
                        "mlp_dp",
                        "embedding_dp",
                        "lm_head_dp",
                        "dcp",
                        "dcp_interleave",
                        "prefill_dcp",
                        "world",
                    ],
                    "properties": {
                        **{
                            key: {"type": "integer", "minimum": 1}
                            for key in (
                                "tp",
                                "dp",
                                "attention_dp",
                                "mlp_dp",
                                "embedding_dp",
                                "lm_head_dp",
                                "dcp",
                                "dcp_interleave",
                                "world",
                            )
                        },
                        "prefill_dcp": {"type": "boolean"},
                    },
                },
            },
        },
        "equivalent": {"type": "boolean"},
        "first_diverging": {
            "type": ["object", "null"],
            "required": ["component", "phase", "metric", "value", "tolerance", "message"],
            "properties": {
                "component": {"type": "string"},
                "phase": {"enum": ["prefill", "decode", None]},
                "metric": {"type": "string"},
                "value": _NUMBER,
                "tolerance": _NUMBER,
                "message": {"type": "string"},
            },
        },
        "failed_checks": {"type": "array", "items": {"type": "string"}},
        "failure": {
            "type": ["object", "null"],
            "required": ["stage", "message"],
            "properties": {
                "stage": {"type": "string"},
                "message": {"type": "string"},
                "refusal": {"type": "boolean"},
                "raised_in": {"type": ["string", "null"]},
            },
        },
        "logits": _LOGITS,
        "components": {"type": "array", "items": _COMPONENT},
        "not_compared": {"type": "array", "items": {"type": "string"}},
        "unused_checkpoint_keys": {"type": "array", "items": {"type": "string"}},
        "tolerances": {"type": "object"},
        "environment": {"type": "object"},
        "timings": {"type": "object", "additionalProperties": {"type": "number"}},
        "routing": _ROUTING,
        "kv_cache": _KV_CACHE,
        "config_variants": _LABELLED_RUNS,
        "parallel_layouts": _LABELLED_RUNS,
        "unread_config_fields": {
            "type": "object",
            "additionalProperties": {"type": "number"},
            "description": "float fields of config.json transformers never read and the port's config "
            "holds, each set far from its value in a run listed under config_variants",
        },
        "lint": {
            "type": "array",
            "description": "autoport-cst lint's findings on the port package, checked before it runs: "
            "one of severity error fails the report at stage lint (the port is not run)",
            "items": _LINT_FINDING,
        },
    },
}


def report_schema_json() -> str:
    return json.dumps(REPORT_SCHEMA, indent=2) + "\n"


def describe_narrowed(precision: dict[str, Any]) -> str:
    """What a port computes narrower than the model's dtype, by its own kernel
    calls, and where (``validate.fixed_precision``)."""
    calls = {f"{e['kernel']} in {e['compute']} (called at {e['site']})" for e in precision["narrowed"]}
    return "; ".join(sorted(calls))
