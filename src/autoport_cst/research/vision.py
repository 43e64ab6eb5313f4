"""The ``vision`` section of a vision-language model's spec: its tower read
from transformers' modules (see :mod:`.vision_tower`), its sizes from
``vision_config``, its M-RoPE sections from ``text_config``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import nn

from autoport_cst.research import vision_names as vn
from autoport_cst.research import vision_tower as vt
from autoport_cst.research.findings import CODE, CONFIG, Finding, known, unknown
from autoport_cst.spec import VisionSpec


@dataclass
class _Reading:
    values: dict[str, Any] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)
    names: dict[str, str] = field(default_factory=dict)  # vision.module_names, gathered on the way

    def put(self, name: str, value: Any, finding: Finding) -> None:
        self.findings.append(finding)
        if finding.known and value is not None:
            self.values[name] = value

    def say(self, name: str, value: Any, evidence: str) -> None:
        self.put(name, value, known(value, f"vision.{name}", CODE, evidence))


def read_vision(
    model: nn.Module, tower_path: str, text_path: str, prefixes: dict[str, str]
) -> tuple[VisionSpec | None, list[Finding]]:
    """The vision spec of ``model`` (a VLM built on the meta device): its tower
    at ``tower_path``, its text decoder at ``text_path``; ``prefixes``: the
    checkpoint's key prefixes of both."""
    r = _Reading()
    tower = model.get_submodule(tower_path)
    config: Any = model.config
    cfg = config.vision_config
    _patch_embedding(r, tower)
    blocks = vt.block_list(tower, getattr(cfg, "depth", None))
    if blocks is None:
        r.findings.append(unknown("vision.depth", CODE, f"{type(tower).__name__}: no list of blocks found"))
        return None, r.findings
    list_name, items = blocks
    r.say("depth", len(items), f"{type(tower).__name__}.{list_name}: {len(items)} blocks")
    _block(r, items[0])
    r.put("num_heads", *vt.config_value(cfg, "vision.num_heads", "num_heads"))
    _positions(r, tower)
    _mergers(r, tower, list_name, cfg)
    kind, full, finding = vt.window_attention(tower, len(items))
    r.put("attention", kind, finding)
    if kind == "window":
        r.values["full_attention_blocks"] = full
        r.put("window_size", *vt.config_value(cfg, "vision.window_size", "window_size"))
    _mrope(r, model.get_submodule(text_path), config.text_config)
    r.values["text_prefix"] = prefixes.get("text")
    r.values["tower_prefix"] = prefixes.get("tower")
    r.put("module_names", r.names, vn.module_names_finding(r.names))
    r.put("config_keys", *vn.config_keys(cfg.to_dict(), r.values))
    return VisionSpec(**r.values), r.findings


def _patch_embedding(r: _Reading, tower: nn.Module) -> None:
    for name, conv in tower.named_modules():
        if isinstance(conv, nn.Conv3d):
            where = f"{name} (Conv3d kernel {tuple(conv.kernel_size)})"
            r.say("hidden_size", conv.out_channels, f"{name}: {conv.out_channels} output channels")
            r.say("temporal_patch_size", conv.kernel_size[0], where)
            r.say("patch_size", conv.kernel_size[-1], where)
            r.say("patch_bias", conv.bias is not None, f"{name}: bias={conv.bias is not None}")
            return
    r.findings.append(
        unknown("vision.patch_size", CODE, f"{type(tower).__name__}: no Conv3d patch embedding")
    )


def _block(r: _Reading, block: nn.Module) -> None:
    name = type(block).__name__
    block_norms = vt.norms(block)
    kind = vt.norm_kind(block_norms[0][1])
    evidence = f"{name}.{block_norms[0][0]}: {kind or 'neither LayerNorm nor RMSNorm arithmetic'}"
    r.put(
        "norm",
        kind,
        known(kind, "vision.norm", CODE, evidence) if kind else unknown("vision.norm", CODE, evidence),
    )
    has_bias = dict(block_norms[0][1].named_parameters()).get("bias") is not None
    r.say("norm_bias", has_bias, f"{name}.{block_norms[0][0]}: bias={has_bias}")
    mlp_name, mlp = next(
        ((n, c) for n, c in block.named_children() if len(vt.linears(c)) >= 2 and not _is_qkv(c)), ("", None)
    )
    if mlp is None:
        r.findings.append(unknown("vision.mlp_kind", CODE, f"{name}: no MLP child with two projections"))
        return
    width = next(iter(vt.linears(mlp)))[1].in_features
    readers = [n for n, lin in vt.linears(mlp) if lin.in_features == width]
    gated = len(readers) == 2
    r.say("mlp_kind", "gated" if gated else "plain", f"{type(mlp).__name__}: {readers} read the block input")
    r.names.update(vn.block_mlp_names(mlp_name, mlp, readers) or {})
    r.say("intermediate_size", vt.linears(mlp)[0][1].out_features, f"{type(mlp).__name__}.{readers[0]} width")
    _activation(r, "activation", mlp)


def _is_qkv(module: nn.Module) -> bool:
    return any(lin.out_features == 3 * lin.in_features for _, lin in vt.linears(module))


def _activation(r: _Reading, name: str, module: nn.Module) -> None:
    for attr, fn in vt.callables(module):
        act = vt.activation_of(fn)
        if act is not None:
            r.say(name, act, f"{type(module).__name__}.{attr} computes {act}")
            return
    r.findings.append(unknown(f"vision.{name}", CODE, f"{type(module).__name__}: no known activation"))


def _positions(r: _Reading, tower: nn.Module) -> None:
    table = [n for n, c in tower.named_children() if isinstance(c, nn.Embedding)]
    kind = "learned_and_rope_2d" if table else "rope_2d"
    evidence = (
        f"{type(tower).__name__}: " + (f"learned table {table[0]} beside" if table else "only") + " 2-D RoPE"
    )
    r.say("positions", kind, evidence)


def _mergers(r: _Reading, tower: nn.Module, blocks: str, cfg: Any) -> None:
    """The merger: a child of the tower ending in a projection to the decoder's
    width; the deep-stack mergers: a list of such children."""
    out = getattr(cfg, "out_hidden_size", None)
    for name, child in tower.named_children():
        if name == blocks:
            continue
        if isinstance(child, nn.ModuleList):
            if len(child) and _last_linear(child[0]) is not None:
                layers, finding = vt.config_value(cfg, "vision.deepstack_layers", "deepstack_visual_indexes")
                layers = layers if layers and len(layers) == len(child) else None
                r.put("deepstack_layers", layers, finding)
                r.say("deepstack", layers is not None, f"{name}: {len(child)} more mergers for {layers}")
            continue
        last = _last_linear(child)
        if last is None or (out is not None and last.out_features != out):
            continue
        r.say("out_hidden_size", last.out_features, f"{name}: last projection width {last.out_features}")
        _merge_size(r, name, child, r.values.get("hidden_size"))
        leaf_norms = [(n, m) for n, m in child.named_modules() if n and (n, m) in _norm_leaves(child)]
        if leaf_norms:
            kind = vt.norm_kind(leaf_norms[0][1])
            if kind is not None:
                r.say("merger_norm", kind, f"{name}.{leaf_norms[0][0]}: {kind} arithmetic")
        r.names.update(vn.merger_names(name, child, leaf_norms[0][0] if leaf_norms else None) or {})
        _merger_activation(r, name, child)


def _merge_size(r: _Reading, name: str, merger: nn.Module, width: int | None) -> None:
    """The side of the folded square: the merger's first projection reads
    merge_size ** 2 patches of the tower's width."""
    first = next((m for m in merger.modules() if isinstance(m, nn.Linear)), None)
    if first is None or not width or first.in_features % width:
        return
    side = round((first.in_features // width) ** 0.5)
    if side * side * width == first.in_features:
        evidence = f"{name}: first projection reads {first.in_features} = {side} x {side} patches x {width}"
        r.say("spatial_merge_size", side, evidence)


def _norm_leaves(module: nn.Module) -> list[tuple[str, nn.Module]]:
    found = []
    for name, sub in module.named_modules():
        params = dict(sub.named_parameters(recurse=False))
        if name and not list(sub.children()) and "weight" in params and params["weight"].dim() == 1:
            found.append((name, sub))
    return found


def _merger_activation(r: _Reading, name: str, merger: nn.Module) -> None:
    for sub in merger.modules():
        for attr, fn in vt.callables(sub):
            act = vt.activation_of(fn)
            if act is not None:
                r.say("merger_activation", act, f"{name}: {type(sub).__name__}.{attr} computes {act}")
                return


def _last_linear(module: nn.Module) -> nn.Linear | None:
    found = [m for m in module.modules() if isinstance(m, nn.Linear)]
    return found[-1] if found else None


def _mrope(r: _Reading, text: nn.Module, text_cfg: Any) -> None:
    params = getattr(text_cfg, "rope_parameters", None) or getattr(text_cfg, "rope_scaling", None) or {}
    section = params.get("mrope_section") if isinstance(params, dict) else None
    if section is None:
        r.findings.append(unknown("vision.mrope_section", CONFIG, "text_config has no mrope_section"))
        return
    r.put(
        "mrope_section", tuple(section), known(tuple(section), "vision.mrope_section", CONFIG, "text_config")
    )
    rotary = next((m for m in text.modules() if hasattr(m, "inv_freq")), None)
    if rotary is None:
        r.findings.append(unknown("vision.mrope_interleaved", CODE, "no rotary table in the text decoder"))
        return
    head_dim = getattr(text_cfg, "head_dim", None) or text_cfg.hidden_size // text_cfg.num_attention_heads
    interleaved, finding = vt.mrope_layout(rotary, head_dim)
    r.put("mrope_interleaved", interleaved, finding)
