"""The research of one model: config, modeling source, checkpoint, the
cross-check that decides the spec, parameter count, TP/EP and pitfalls."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from autoport_cst.config_json import is_vision_language
from autoport_cst.research.checkpoint import CheckpointHeader, checkpoint_findings, pattern, read_checkpoint
from autoport_cst.research.code_analysis import CodeAnalysis, analyze_code
from autoport_cst.research.config_analysis import (
    ConfigAnalysis,
    analyze_config,
    read_config,
    resolve_config,
    text_model_config,
)
from autoport_cst.research.config_dependence import ConfigDependence, probe_config
from autoport_cst.research.crosscheck import ParameterCount, count_parameters, decide_spec
from autoport_cst.research.findings import Conflict, Finding
from autoport_cst.research.hub import ResolvedSource, resolve_source
from autoport_cst.research.parallelism import ParallelDims, ParallelPlan, plan_parallelism
from autoport_cst.research.pitfalls import pitfalls
from autoport_cst.research.sources import locate_modeling_source
from autoport_cst.spec import ArchSpec


@dataclass(frozen=True)
class Research:
    """Everything ``plan`` found about one model."""

    source: str
    model_type: str
    architecture: str
    spec: ArchSpec
    findings: tuple[Finding, ...]  # what each source said
    decisions: tuple[Finding, ...]  # per spec field: the finding its value came from
    conflicts: tuple[Conflict, ...]
    unknown: tuple[str, ...]  # spec fields no source classified
    parameters: ParameterCount
    parallel: ParallelPlan
    pitfalls: tuple[str, ...]
    modeling_source: str | None
    checkpoint_files: tuple[str, ...]
    # the header's tensor key patterns (layer indices as *): what a port may load
    checkpoint_keys: tuple[str, ...] = ()
    # what config_dependence varies (probe_config's arguments), None: nothing to vary
    dependence_inputs: tuple | None = field(default=None, repr=False, compare=False)

    @cached_property
    def config_dependence(self) -> ConfigDependence | None:
        """The config fields the code reads and what varying each changes
        (None: no transformers configuration to vary, or no analysis of the
        code), researched on first use: a plan needs it, not every caller."""
        return probe_config(*self.dependence_inputs) if self.dependence_inputs else None

    def finding(self, name: str, source: str | None = None) -> Finding | None:
        for f in reversed(self.findings):
            if f.field == name and (source is None or f.source == source):
                return f
        return None

    def decision(self, name: str) -> Finding | None:
        for f in reversed(self.decisions):
            if f.field == name:
                return f
        return None


def research(source: str) -> Research:
    """Research a checkpoint directory (or a hub id, with network)."""
    return research_resolved(resolve_source(source))


def research_resolved(resolved: ResolvedSource) -> Research:
    config_path = str(resolved.config_path)
    raw = read_config(resolved.config_path)
    config_obj = resolve_config(raw, config_path)
    header: CheckpointHeader | None = resolved.header
    if header is None and resolved.directory is not None:
        header = read_checkpoint(resolved.directory)
    if is_vision_language(raw):
        from autoport_cst.research.vlm import research_vlm

        return Research(**research_vlm(resolved, raw, config_obj, header, safe_analyze_code, parallel_dims))
    cfg = analyze_config(*text_model_config(raw, config_obj), config_path)
    modeling = locate_modeling_source(cfg.model_type, config_path)
    architecture = cfg.architecture or _causal_lm_name(cfg.model_type)
    code = safe_analyze_code(modeling, config_obj if config_obj is not None else raw, architecture, cfg.dims)
    ckpt_findings = checkpoint_findings(header, cfg.dims) if header is not None else []
    decision = decide_spec(cfg, code, header, ckpt_findings)
    spec = decision.spec
    findings: list[Finding] = [*cfg.findings, *code.findings, *ckpt_findings, *decision.notes]
    quantized = any(f.field in ("checkpoint.quantized", "config.quantization") and f.known for f in findings)
    parameters = count_parameters(spec, code, header, quantized)
    parallel = plan_parallelism(parallel_dims(spec, code, cfg), parameters.total, parameters.experts)
    notes = pitfalls(spec, findings, decision.conflicts, decision.unknown, parallel)
    dependence = None
    if config_obj is not None and code.config_reads:
        dependence = (raw, config_obj, config_path, modeling, architecture, code.config_reads)
    return Research(
        source=resolved.label,
        model_type=cfg.model_type,
        architecture=architecture,
        spec=spec,
        findings=tuple(findings),
        decisions=tuple(decision.decisions),
        conflicts=tuple(decision.conflicts),
        unknown=tuple(decision.unknown),
        parameters=parameters,
        parallel=parallel,
        pitfalls=tuple(notes),
        modeling_source=str(modeling.path),
        checkpoint_files=header.files if header is not None else (),
        checkpoint_keys=tuple(sorted({pattern(name) for name in header.tensors}))
        if header is not None
        else (),
        dependence_inputs=dependence,
    )


def safe_analyze_code(modeling: Any, config: Any, architecture: str, dims: dict[str, Any]) -> CodeAnalysis:
    """analyze_code; an analysis gap must not hide the rest of the research."""
    try:
        return analyze_code(modeling, config, architecture, dims)
    except (RecursionError, Exception) as exc:
        code = CodeAnalysis(str(modeling.path), architecture)
        code.add(
            Finding(
                "code.analysis",
                None,
                "code",
                f"the source analysis stopped: {type(exc).__name__}: {exc}",
                "unknown",
            )
        )
        return code


def parallel_dims(spec: ArchSpec, code: CodeAnalysis | None, cfg: ConfigAnalysis) -> ParallelDims:
    a = spec.attention
    heads = a.num_heads or 0
    shared = None
    dense = None
    if code is not None:
        f = code.get("code.shared_expert_intermediate")
        shared = f.value if f is not None and f.known else None
        if code.dense_layers and spec.moe is not None:
            dense = cfg.value("mlp.intermediate_size")
    if spec.moe is not None:
        intermediate = spec.moe.intermediate_size
        experts = spec.moe.num_experts
    else:
        intermediate = spec.mlp.intermediate_size or cfg.value("mlp.intermediate_size")
        experts = None
    return ParallelDims(
        num_heads=heads,
        num_kv_heads=a.num_kv_heads or heads,
        intermediate_size=intermediate,
        vocab_size=spec.embedding.vocab_size or 0,
        num_experts=experts,
        shared_intermediate_size=shared,
        dense_intermediate_size=dense,
        **_latent_dims(spec),
    )


def _latent_dims(spec: ArchSpec) -> dict[str, Any]:
    """Multi-latent attention's cached row width, the layers, and the
    parameters of its replicated low-rank projections of the hidden state
    (q_a_proj and kv_a_proj of every layer)."""
    a = spec.attention
    if a.kind != "latent" or not a.kv_lora_rank or not a.qk_rope_head_dim:
        return {}
    width = a.kv_lora_rank + a.qk_rope_head_dim
    per_layer = (spec.hidden_size or 0) * (width + (a.q_lora_rank or 0))
    return {
        "latent_width": width,
        "num_layers": spec.num_layers,
        "replicated_parameters": per_layer * (spec.num_layers or 0),
    }


def _causal_lm_name(model_type: str) -> str:
    try:
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

        name = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type)
    except ImportError:  # pragma: no cover - transformers missing
        name = None
    if not name:
        from autoport_cst.errors import InputError

        raise InputError(
            f"config.json has no architectures and transformers has no causal-LM class for {model_type!r}"
        )
    return name


def to_data(value: Any) -> Any:
    """JSON-friendly form of research results (dataclasses, tuples)."""
    import dataclasses

    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_data(getattr(value, f.name)) for f in dataclasses.fields(value) if f.repr}
    if isinstance(value, (list, tuple)):
        return [to_data(v) for v in value]
    if isinstance(value, dict):
        return {str(k): to_data(v) for k, v in value.items()}
    return value
