"""The research of a vision-language checkpoint: the text decoder researched
as a text model (its config is ``text_config``, its code the class
transformers builds for it, its checkpoint the tensors under its key prefix),
the vision tower read by :mod:`.vision` into the spec's ``vision`` section."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import Any

from autoport_cst.errors import InputError
from autoport_cst.research.checkpoint import CheckpointHeader, checkpoint_findings, pattern
from autoport_cst.research.config_analysis import analyze_config
from autoport_cst.research.crosscheck import count_parameters, decide_spec
from autoport_cst.research.findings import CHECKPOINT, CODE, Finding, known, unknown
from autoport_cst.research.hub import ResolvedSource
from autoport_cst.research.parallelism import plan_parallelism
from autoport_cst.research.pitfalls import pitfalls
from autoport_cst.research.sources import locate_modeling_source
from autoport_cst.research.vision import read_vision
from autoport_cst.research.vision_parallelism import plan_tower_parallelism, tower_notes


def research_vlm(
    resolved: ResolvedSource,
    raw: dict[str, Any],
    config_obj: Any,
    header: CheckpointHeader | None,
    safe_analyze_code: Callable[..., Any],
    parallel_dims: Callable[..., Any],
) -> dict[str, Any]:
    """The fields of the pipeline's ``Research`` of a vision-language
    checkpoint (the pipeline's code analysis and TP dimensions passed in)."""
    config_path = str(resolved.config_path)
    architecture = (raw.get("architectures") or [None])[0]
    if config_obj is None or not architecture:
        raise InputError(f"{config_path}: a vision-language config needs transformers and its architectures")
    model = meta_model(config_obj, architecture, config_path)
    paths = component_paths(model, config_obj)
    prefixes, prefix_findings = stored_prefixes(model, paths, header)
    text_raw = {"tie_word_embeddings": raw.get("tie_word_embeddings", False), **raw["text_config"]}
    text_raw["architectures"] = None
    cfg = analyze_config(text_raw, config_obj.text_config, config_path)
    modeling = locate_modeling_source(raw["model_type"], config_path)
    text_class = type(model.get_submodule(paths["text"])).__name__
    code = safe_analyze_code(modeling, config_obj.text_config, text_class, cfg.dims)
    vision, vision_findings = read_vision(model, paths["tower"], paths["text"], prefixes)
    text_model = model.get_submodule(paths["text"])
    for finding in [
        *head_findings(model, cfg.dims.get("vocab_size")),
        *mrope_rotation(code, vision_findings),
        *rotary_fraction(code, text_model, cfg.dims.get("head_dim")),
    ]:
        code.add(finding)
    text_header = under_prefix(header, prefixes.get("text"), prefixes.get("tower"))
    ckpt_findings = checkpoint_findings(text_header, cfg.dims) if text_header is not None else []
    decision = decide_spec(cfg, code, text_header, ckpt_findings)
    spec = dataclasses.replace(decision.spec, vision=vision)
    if vision is None:  # never a text-only spec: the tower is what stops the port
        spec = dataclasses.replace(
            spec, unsupported=(*(spec.unsupported or ()), unread_tower(model, paths, vision_findings))
        )
    findings = [*cfg.findings, *code.findings, *ckpt_findings, *prefix_findings, *vision_findings]
    findings += decision.notes
    unknown_fields = [*decision.unknown, *(f.field for f in vision_findings if not f.known)]
    quantized = any(f.field in ("checkpoint.quantized", "config.quantization") and f.known for f in findings)
    parameters = count_parameters(spec, code, header, quantized)
    tower_parameters = sum(p.numel() for p in model.get_submodule(paths["tower"]).parameters())
    parallel, tower = _parallel(parallel_dims(spec, code, cfg), parameters, tower_parameters, vision)
    notes = pitfalls(spec, findings, decision.conflicts, unknown_fields, parallel) + tower
    return dict(
        source=resolved.label,
        model_type=raw["model_type"],
        architecture=architecture,
        spec=spec,
        findings=tuple(findings),
        decisions=tuple(decision.decisions),
        conflicts=tuple(decision.conflicts),
        unknown=tuple(sorted(set(unknown_fields))),
        parameters=parameters,
        parallel=parallel,
        pitfalls=tuple(notes),
        modeling_source=str(modeling.path),
        checkpoint_files=header.files if header is not None else (),
        checkpoint_keys=tuple(sorted({pattern(n) for n in header.tensors})) if header is not None else (),
    )


def _parallel(dims: Any, parameters: Any, tower_parameters: int, vision: Any) -> tuple[Any, list[str]]:
    """TP sizing of the decoder (its parameters: all but the tower's) and of
    the tower apart (vision encoder parallelism), the tower's as notes."""
    decoder_parameters = max(parameters.total - tower_parameters, 0)
    parallel = plan_parallelism(dims, decoder_parameters, parameters.experts)
    if vision is None:
        return parallel, []
    tower = plan_tower_parallelism(vision, tower_parameters)
    return parallel, tower_notes(tower, parallel.recommended_tp)


def head_findings(model: Any, vocab: int | None) -> list[Finding]:
    """The LM head is the vision-language class's, not the text model's: its
    projection to the vocabulary (bias) and what its forward does to the
    logits after it (a rescale or softcap would assign them again)."""
    from torch import nn

    cls = type(model).__name__
    heads = [
        (n, m) for n, m in model.named_children() if isinstance(m, nn.Linear) and m.out_features == vocab
    ]
    if len(heads) != 1:
        return []
    name, head = heads[0]
    found = [
        known(head.bias is not None, "lm_head.bias", CODE, f"{cls}.{name}: bias={head.bias is not None}")
    ]
    assigned = _assignments_after_head(inspect_source(type(model).forward), name)
    if assigned is not None and not assigned[1]:
        where = f"{cls}.forward: {assigned[0]} = self.{name}(...), not assigned again"
        for field in ("lm_head.softcap", "lm_head.logits_divisor"):
            found.append(known(None, field, CODE, where))
    return found


def _assignments_after_head(src: str, head: str) -> tuple[str, list[int]] | None:
    """The name the forward assigns ``self.<head>(...)`` to, and the lines
    that assign that name again after it; None when no such call is found."""
    import ast
    import textwrap

    try:
        tree = ast.parse(textwrap.dedent(src))
    except SyntaxError:
        return None
    target, line = None, 0
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            func = node.value.func
            if (
                isinstance(func, ast.Attribute)
                and func.attr == head
                and isinstance(node.targets[0], ast.Name)
            ):
                target, line = node.targets[0].id, node.lineno
    if target is None:
        return None
    again = [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign))
        and node.lineno > line
        and any(isinstance(t, ast.Name) and t.id == target for t in _targets(node))
    ]
    return target, again


def _targets(node: Any) -> list[Any]:
    return list(node.targets) if hasattr(node, "targets") else [node.target]


def mrope_rotation(code: Any, vision_findings: list[Finding]) -> list[Finding]:
    """The decoder's rotation style when the analysis read the rotation
    function but not which frequency each pair takes because the rotary
    module recomposes its tables (M-RoPE): that layout is the vision
    section's mrope_interleaved, read by its own probe."""
    style = code.get("rope.style")
    layout = next((f for f in vision_findings if f.field == "vision.mrope_interleaved" and f.known), None)
    if style is None or style.known or layout is None:
        return []
    styles = set(re.findall(r"\((rotate_half|interleaved)\)", style.evidence))
    if len(styles) != 1:
        return []
    evidence = f"{style.evidence.split(', but ')[0]}; the M-RoPE frequency layout: {layout.evidence}"
    return [known(styles.pop(), "rope.style", CODE, evidence)]


def rotary_fraction(code: Any, text_model: Any, head_dim: int | None) -> list[Finding]:
    """The rotated fraction of a head when the attention analysis did not
    find the rotary module (the text model computes the M-RoPE tables once
    and hands them to every layer): its table's frequencies, two dimensions
    each, over head_dim."""
    found = code.get("rope.partial_rotary_factor")
    if found is None or found.known or not head_dim:
        return []
    tables = [(type(m).__name__, m.inv_freq) for m in text_model.modules() if hasattr(m, "inv_freq")]
    if len(tables) != 1:
        return []
    name, inv_freq = tables[0]
    rotated = 2 * inv_freq.shape[-1]
    evidence = f"{name}.inv_freq: {inv_freq.shape[-1]} frequencies, {rotated} of head_dim {head_dim} rotated"
    return [known(rotated / head_dim, "rope.partial_rotary_factor", CODE, evidence)]


def inspect_source(fn: Any) -> str:
    import inspect

    try:
        return inspect.getsource(fn)
    except (OSError, TypeError):
        return ""


def meta_model(config_obj: Any, architecture: str, where: str) -> Any:
    """transformers' ``architecture`` built on the meta device (no memory)."""
    import torch
    import transformers

    cls = getattr(transformers, architecture, None)
    if cls is None:
        raise InputError(f"{where}: transformers has no class {architecture!r} (config.json architectures)")
    with torch.device("meta"):
        return cls(config_obj)


def unread_tower(model: Any, paths: dict[str, str], findings: list[Finding]) -> str:
    """The ``unsupported`` entry of a vision tower the vision section cannot
    describe (its spec would otherwise read as a text-only model's)."""
    tower = type(model.get_submodule(paths["tower"])).__name__
    why = "; ".join(f.evidence for f in findings if not f.known) or "not read"
    return f"vision_tower: {tower} at {paths['tower']} is not a tower the spec's vision section describes ({why})"


def component_paths(model: Any, config_obj: Any) -> dict[str, str]:
    """The module paths of the text decoder and of the tower: the first
    submodules built from text_config's and vision_config's model types."""
    kinds = {"text": config_obj.text_config.model_type, "tower": config_obj.vision_config.model_type}
    paths: dict[str, str] = {}
    for name, module in model.named_modules():
        model_type = getattr(getattr(module, "config", None), "model_type", None)
        for part, kind in kinds.items():
            if name and model_type == kind:
                paths.setdefault(part, name)
    missing = [part for part in kinds if part not in paths]
    if missing:
        raise InputError(
            f"{type(model).__name__}: no submodule built from the {' and '.join(missing)} config"
        )
    return paths


def stored_prefixes(
    model: Any, paths: dict[str, str], header: CheckpointHeader | None
) -> tuple[dict[str, str], list[Finding]]:
    """Where the checkpoint stores each part: the prefix before the part's
    first parameter name (the module path when there is no checkpoint)."""
    prefixes, findings = {}, []
    for part, path in paths.items():
        first = next(name for name, _ in model.get_submodule(path).named_parameters())
        field = f"vision.{part if part == 'tower' else 'text'}_prefix"
        if header is None:
            prefixes[part] = path
            findings.append(known(path, field, CODE, f"module path {path} (no checkpoint read)"))
            continue
        stored = [key[: -len(first) - 1] for key in header.tensors if key.endswith("." + first)]
        if not stored:
            findings.append(unknown(field, CHECKPOINT, f"no stored tensor ends with {first} ({path})"))
            continue
        prefixes[part] = min(stored, key=len)
        findings.append(known(prefixes[part], field, CHECKPOINT, f"{prefixes[part]}.{first} is stored"))
    return prefixes, findings


def under_prefix(
    header: CheckpointHeader | None, prefix: str | None, tower: str | None
) -> CheckpointHeader | None:
    """The text decoder's tensors: those stored under ``prefix``, named
    without it, and those outside both parts (the LM head)."""
    if header is None or prefix is None:
        return None
    cut = len(prefix) + 1
    tensors = {}
    for key, info in header.tensors.items():
        if key.startswith(prefix + "."):
            tensors[key[cut:]] = dataclasses.replace(info, name=key[cut:])
        elif tower is None or not key.startswith(tower + "."):
            tensors[key] = info
    return dataclasses.replace(header, tensors=tensors)
