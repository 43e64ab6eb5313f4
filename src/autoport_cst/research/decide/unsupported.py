"""What the spec cannot describe, named (the spec's ``unsupported``): a
failed analysis of the model's structure, computation fields no source
classified (their default would be a guess), sizes the code computes
differently from the config field a port reads, code features no field
describes, and every ``unsupported.<name>`` finding of the code analysis.
A plan carrying any is refused."""

from __future__ import annotations

from typing import Any

from autoport_cst.research.decide.attention import multi_query_key
from autoport_cst.research.decide.state import Decider
from autoport_cst.research.findings import CONFIG, DERIVED, known

# structure the analysis could not establish: nothing else it says can be trusted
ANALYSIS_FAILURES = (
    "code.analysis",
    "code.causal_lm",
    "code.decoder_layers",
    "code.attention",
    "code.mlp",
    "code.mixers",
)
# sizes every reference reads from config.json at run time
CONFIG_READ_SIZES = (
    "mlp.intermediate_size",
    "attention.num_heads",
    "attention.num_kv_heads",
    "attention.head_dim",
)
# unknown spec fields whose default is not a guess at the computation
NOT_COMPUTATIONS = ("norm.eps_key",)
# the evidence of a field nothing read (research/decide/state.py)
NOT_DESCRIBED = "no source describes it"
# code facts the spec has no field for, and that no reference computes
FEATURE_FINDINGS = {
    "code.qkv_clip": "queries, keys and values clamped to a range (clip_qkv)",
    "code.mlp_inner_norm": "a norm inside the MLP before its output projection",
    "code.attention_parameters": "learned parameters in the attention computation",
    "code.value_norm": "a norm applied to the attention's values",
}


def _short(text: str, limit: int = 180) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def unsupported(d: Decider) -> tuple[str, ...] | None:
    """What the spec cannot describe, named: a failed analysis of the
    model's structure, or a computation field no source could classify
    (its default would be a guess). Checkpoint layout fields and the
    epsilon's config key are not computations (a wrong guess fails to
    load, or reads the same value)."""
    explained = _explained_sections(d)
    items: list[str] = list(_features(d, explained) or ())
    parameters = d.code_finding("code.attention_parameters")
    if parameters is not None and parameters.known and parameters.value:
        explained.add("attention")  # its own parameters are why its kernel arguments were not read (XLNet)
    failed = False
    for name in ANALYSIS_FAILURES:
        finding = d.code_finding(name)
        if finding is not None and not finding.known:
            failed = True
            if name not in explained:  # else a named computation is why (analysis/mixers.py)
                items.append(f"{name}: {_short(finding.evidence)}")
    if not failed:
        unknown = {
            name: next((x.evidence for x in reversed(d.decisions) if x.field == name), "")
            for name in sorted(set(d.unknown))
            if not name.startswith("checkpoint.") and name not in NOT_COMPUTATIONS
        }
        following = _following(unknown)
        for name, evidence in unknown.items():
            if name.split(".", 1)[0] in explained or name in explained:
                continue  # the named computation is why research could not classify it
            if name not in following:
                items.append(f"{name}: {_short(evidence)}")
    for name in CONFIG_READ_SIZES:
        if name in explained:
            continue  # built by a computation named (sizes per layer, a projection counted with q, k, v)
        cfg, code = d.cfg_finding(name), d.code_finding(name)
        if name == "attention.num_kv_heads" and multi_query_key(d) is not None:
            continue  # the port reads the multi-query flag (multi-query codemod)
        if name == "mlp.intermediate_size" and _dense_width_given(d, code):
            continue  # the dense MLP of an MoE model reads intermediate_size_mlp (dense-layers)
        if cfg is not None and cfg.known and isinstance(cfg.value, (list, tuple)) and cfg.value:
            # one value per layer (Gemma 3n's intermediate_size): not a size the code builds otherwise
            shown = ", ".join(str(v) for v in dict.fromkeys(cfg.value))
            items.append(
                f"per_layer_sizes: config.json gives {name} one value per layer ({len(cfg.value)} "
                f"entries: {shown}); a port reads one value"
            )
            continue
        if (
            cfg is not None
            and code is not None
            and cfg.known
            and code.known
            and cfg.source == CONFIG
            and cfg.value is not None
            and code.value is not None
            and cfg.value != code.value
        ):
            items.append(_size_differs(name, code.value, cfg.value, code.evidence))
    for name, what in FEATURE_FINDINGS.items():
        finding = d.code_finding(name)
        if finding is not None and finding.known and finding.value:
            items.append(f"{what}: {_short(finding.evidence)}")
    offset = _qk_norm_offset_differs(d)
    if offset is not None:
        items.append(offset)
    kind = _qk_norm_kind_differs(d)
    if kind is not None:
        items.append(kind)
    if not items:
        return None
    d.decisions.append(
        known(tuple(items), "unsupported", DERIVED, f"{len(items)} computation(s) the spec cannot describe")
    )
    return tuple(items)


def _size_differs(name: str, built: Any, given: Any, evidence: str) -> str:
    """A size the code builds other than config.json's, with the config
    fields the code computes it from when research read them
    (analysis/width_source.py: LFM2's MLP width)."""
    derived = "computes it from config" in evidence
    why = (
        f"a port builds {name.split('.')[-1]} as config.json gives it (no codemod computes the width "
        "from other fields)"
        if derived
        else "a port reads the config's value"
    )
    return (
        f"{name}: the code builds {built} where the config says {given} "
        f"({_short(evidence, 240 if derived else 100)}); {why}"
    )


def _qk_norm_offset_differs(d: Decider) -> str | None:
    """q/k norms that apply their weight in another form than the layer
    norms (``x * weight`` against ``x * (1 + weight)``): a port gives both
    the spec's one ``norm.unit_offset``."""
    qk, layers = d.code_finding("code.qk_norm_unit_offset"), d.code_finding("norm.unit_offset")
    if qk is None or layers is None or not qk.known or not layers.known or qk.value == layers.value:
        return None
    return f"q/k norms weighted unlike the layer norms: {_short(qk.evidence)}; {_short(layers.evidence)}"


def _qk_norm_kind_differs(d: Decider) -> str | None:
    """q/k norms that compute another norm than the layer norms: a port
    builds its q/k norms with the layer norms' class (the spec's one
    ``norm.kind`` and ``norm.bias``), so RMSNorms with RMSNorm layers, or
    LayerNorms whose bias is the layers' (Persimmon), and nothing else."""
    qk_norm = d.code_finding("attention.qk_norm")
    if qk_norm is None or not qk_norm.known or qk_norm.value == "none":
        return None
    qk, layers = d.code_finding("code.qk_norm_kind"), d.code_finding("norm.kind")
    if qk is None or not qk.known or not qk.value:  # RMSNorms
        if layers is None or not layers.known or layers.value == "rmsnorm":
            return None
        return f"q/k RMSNorms beside {layers.value} layer norms: {_short(qk_norm.evidence)}"
    bias, layer_bias = d.code_finding("code.qk_norm_bias"), d.code_finding("norm.bias")
    if (
        layers is not None
        and layers.known
        and layers.value == qk.value
        and bias is not None
        and layer_bias is not None
        and bias.known
        and layer_bias.known
        and bool(bias.value) == bool(layer_bias.value)
    ):
        return None  # the layer norms' kind and bias
    return f"q/k norms that are not RMSNorms: {_short(qk.evidence)}"


def _following(unknown: dict[str, str]) -> set[str]:
    """The unclassified fields that follow from another one listed, so that
    a refusal names each cause once: a field no source describes where
    another field of its section was looked at and not classified (XLNet's
    sinks and softcap beside its scale read from no kernel call); the
    norms' kind, bias and offset where no norm was found because the layer's
    flow was not followed, and the parallel residual read from that same
    flow (``norm.placement`` says why)."""
    described = {name.split(".", 1)[0] for name, ev in unknown.items() if NOT_DESCRIBED not in ev}
    out = {name for name, ev in unknown.items() if NOT_DESCRIBED in ev and name.split(".", 1)[0] in described}
    placement = unknown.get("norm.placement")
    if placement is not None:
        out |= {
            name
            for name in ("norm.kind", "norm.bias", "norm.unit_offset")
            if "no norm found" in unknown.get(name, "")
        }
        parallel = unknown.get("residual.parallel")
        if parallel is not None and (_why(parallel).endswith(":") or _why(parallel) == _why(placement)):
            out.add("residual.parallel")  # no reason of its own, or the placement's
    return out


def _why(evidence: str) -> str:
    """The reason of an unclassified field's evidence, without the default
    the spec keeps."""
    return evidence.split(" (spec keeps", 1)[0].strip()


def _dense_width_given(d: Decider, code: Any) -> bool:
    """The dense layers of an MoE model as wide as config.json's
    ``intermediate_size_mlp`` (Llama 4, whose ``intermediate_size`` is the
    experts' width): the dense MLP of a port reads that field."""
    raw = d.cfg.raw if d.cfg is not None else {}
    dense = d.code_finding("moe.dense_layers")
    return (
        code is not None
        and code.known
        and raw.get("intermediate_size_mlp") == code.value
        and dense is not None
        and bool(dense.value)
    )


def _explained_sections(d: Decider) -> set[str]:
    """The spec sections (or single fields) a named computation of the code
    analysis accounts for (the value of its ``unsupported.<name>`` finding)."""
    if d.code is None:
        return set()
    return {
        section
        for finding in d.code.findings
        if finding.field.startswith("unsupported.") and finding.known and isinstance(finding.value, tuple)
        for section in finding.value
        if isinstance(section, str)
    }


def _features(d: Decider, explained: set[str]) -> tuple[str, ...] | None:
    """What the code computes that no spec field describes: every
    ``unsupported.<name>`` finding of the code analysis, as
    ``"<name>: <evidence>"`` (sorted), but those another one explains
    (``moe.expert_mlp`` where the experts' layout is named)."""
    if d.code is None:
        return None
    found: dict[str, str] = {}
    for finding in d.code.findings:
        if finding.field.startswith("unsupported.") and finding.known and finding.value:
            name = finding.field[len("unsupported.") :]
            if name in explained:
                continue
            found.setdefault(name, f"{name}: {finding.evidence}")
            d.decisions.append(finding)
    return tuple(found[name] for name in sorted(found)) or None
