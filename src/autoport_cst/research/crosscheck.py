"""Cross-check config, code and checkpoint, and decide the spec.

Which source decides a field:

- sizes and settings read from the configuration (hidden size, heads,
  vocabulary, eps, RoPE theta and scaling) come from config.json; the
  checkpoint shapes and the code's own computation check them;
- what is computed (norm kind, biases, MLP kind, placement, scaling...)
  comes from the code evaluated with the configuration, because that is what
  transformers computes and what validation compares against; the
  checkpoint checks that the tensors the code creates are the ones stored.

A disagreement is a :class:`Conflict` naming every claim and the value the
spec took. A field no source could classify keeps the spec default and is
listed in ``unknown`` (never guessed).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from autoport_cst.research.checkpoint import CheckpointHeader, pattern
from autoport_cst.research.code_analysis import CodeAnalysis
from autoport_cst.research.config_analysis import ConfigAnalysis
from autoport_cst.research.keys import canonical_keys, derive_key_map, rename
from autoport_cst.research.findings import (
    CHECKPOINT,
    CODE,
    CONFIG,
    DERIVED,
    INFERRED,
    Claim,
    Conflict,
    Finding,
    known,
    unknown,
)
from autoport_cst.spec import (
    ArchSpec,
    AttentionSpec,
    CheckpointSpec,
    EmbeddingSpec,
    LMHeadSpec,
    MLPSpec,
    MoESpec,
    NormSpec,
    ResidualSpec,
    RopeSpec,
)


# structure the analysis could not establish: nothing else it says can be trusted
ANALYSIS_FAILURES = ("code.analysis", "code.causal_lm", "code.decoder_layers", "code.attention", "code.mixers")
# sizes every reference reads from config.json at run time
CONFIG_READ_SIZES = ("mlp.intermediate_size", "attention.num_heads", "attention.num_kv_heads", "attention.head_dim")
# unknown spec fields whose default is not a guess at the computation
NOT_COMPUTATIONS = ("norm.eps_key",)
# code facts the spec has no field for, and that no reference computes
FEATURE_FINDINGS = {
    "code.qkv_clip": "queries, keys and values clamped to a range (clip_qkv)",
    "code.qk_norm_kind": "q/k norms that are not RMSNorms",
    "code.mlp_inner_norm": "a norm inside the MLP before its output projection",
    "code.attention_parameters": "learned parameters in the attention computation",
}


def _short(text: str, limit: int = 180) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass(frozen=True)
class ParameterCount:
    total: int
    experts: int
    source: str  # checkpoint | code | config
    evidence: str


@dataclass
class Decision:
    spec: ArchSpec
    decisions: list[Finding]
    conflicts: list[Conflict]
    unknown: list[str]
    notes: list[Finding]


class _Decider:
    def __init__(self, cfg: ConfigAnalysis, code: CodeAnalysis | None, ckpt: CheckpointHeader | None,
                 ckpt_findings: list[Finding]) -> None:
        self.cfg = cfg
        self.code = code
        self.ckpt = ckpt
        self.ckpt_findings = ckpt_findings
        self.decisions: list[Finding] = []
        self.conflicts: list[Conflict] = []
        self.unknown: list[str] = []
        self.notes: list[Finding] = []

    # ---- lookups -------------------------------------------------------------

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

    def conflict(self, field: str, claims: list[tuple[str, Any, str]], resolution: str,
                 severity: str = "error") -> None:
        self.conflicts.append(Conflict(field, tuple(Claim(s, v, e) for s, v, e in claims), resolution, severity))

    # ---- the spec ------------------------------------------------------------

    def build(self) -> ArchSpec:
        cfg = self.cfg
        dims = cfg.dims
        code_head_dim = self.code_finding("attention.head_dim")
        head_dim = dims.get("head_dim")
        if code_head_dim is not None and code_head_dim.known:
            if head_dim is not None and code_head_dim.value != head_dim:
                self.conflict("attention.head_dim", [
                    (CONFIG, head_dim, self.cfg_finding("attention.head_dim").evidence),
                    (CODE, code_head_dim.value, code_head_dim.evidence)],
                    f"the spec takes {code_head_dim.value}: the code computes the head size itself")
            head_dim = code_head_dim.value
        norm = NormSpec(
            kind=self.decide("norm.kind", "rmsnorm"),
            bias=self.decide("norm.bias", False),
            unit_offset=self.decide("norm.unit_offset", False),
            placement=self.decide("norm.placement", "pre"),
            eps_key=self.eps_key(),
            affine=self.flag("code.norm_affine", True),
            eps=self.eps(),
        )
        sliding = self.decide("attention.sliding_window", "none", (CODE,))
        window_size = None
        if sliding != "none":
            window_size = self.decide("attention.sliding_window_size", None, (CODE,))
            if window_size is None:
                window_size = self.value("config.sliding_window")
        layer_types = self.value("attention.layer_types")
        heads = self.count("attention.num_heads", dims.get("num_heads"))
        kv_heads = self.count("attention.num_kv_heads", dims.get("num_kv_heads"))
        scale = self.decide("attention.scale", None, (CODE,))
        scale_key, scale_form = None, "multiplier"
        if scale is not None:
            scale_key = self.decide("attention.scale_key", None, (CODE,))
            if scale_key is not None:
                scale_form = self.decide("attention.scale_form", "multiplier", (CODE,))
        attention = AttentionSpec(
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            qkv_bias=self.decide("attention.qkv_bias", False, (CODE,)),
            o_bias=self.decide("attention.o_bias", False, (CODE,)),
            qk_norm=self.decide("attention.qk_norm", "none", (CODE,)),
            qk_norm_position=self.flag("attention.qk_norm_position", "before_rope"),
            sliding_window=sliding,
            sliding_window_size=window_size,
            layer_types=tuple(layer_types) if layer_types else None,
            sinks=self.decide("attention.sinks", False, (CODE,)),
            softcap=self.decide("attention.softcap", None, (CODE,)),
            scale=scale,
            scale_key=scale_key,
            scale_form=scale_form,
            kind=self.flag("attention.kind", "softmax"),
            output_norm=self.flag("attention.output_norm", False),
            other_mixer_layers=self.flag("attention.other_mixer_layers", None),
        )
        rope = self.rope()
        moe = self.moe()
        mlp = MLPSpec(
            kind=self.decide("mlp.kind", "gated", (CODE,)),
            activation=self.decide("mlp.activation", "silu", (CODE,)),
            bias=self.decide("mlp.bias", False, (CODE,)),
            intermediate_size=self.intermediate(moe is not None),
            glu=self.flag("mlp.glu", "standard"),
            glu_alpha=self.flag("mlp.glu_alpha", None),
            glu_limit=self.flag("mlp.glu_limit", None),
        )
        embedding = EmbeddingSpec(
            vocab_size=dims.get("vocab_size"),
            tied=self.tied(),
            scale=self.decide("embedding.scale", "none", (CODE,)),
            multiplier=self.decide("embedding.multiplier", None, (CODE,)),
            learned_positions=self.flag("embedding.learned_positions", False),
        )
        divisor = self.decide("lm_head.logits_divisor", None, (CODE,))
        logits_key, logits_form = None, "divisor"
        if divisor is not None:
            logits_key = self.decide("lm_head.logits_key", None, (CODE,))
            if logits_key is not None:
                logits_form = self.decide("lm_head.logits_form", "divisor", (CODE,))
        lm_head = LMHeadSpec(
            bias=self.decide("lm_head.bias", False, (CODE,)),
            softcap=self.decide("lm_head.softcap", None, (CODE,)),
            logits_divisor=divisor,
            logits_key=logits_key,
            logits_form=logits_form,
        )
        residual = ResidualSpec(
            parallel=self.decide("residual.parallel", "none", (CODE,)),
            multiplier=self.decide("residual.multiplier", None, (CODE,)),
        )
        self.num_layers_check()
        self.config_code_checks(rope)
        if self.code is not None and self.ckpt is not None:
            self.checkpoint_checks(attention, lm_head, embedding)
        checkpoint = self.checkpoint_layout(moe is not None, embedding.tied)
        return ArchSpec(
            hidden_size=dims.get("hidden_size"),
            num_layers=dims.get("num_layers"),
            max_position_embeddings=self.value("max_position_embeddings"),
            norm=norm,
            attention=attention,
            rope=rope,
            mlp=mlp,
            moe=moe,
            embedding=embedding,
            lm_head=lm_head,
            residual=residual,
            checkpoint=checkpoint,
            unsupported=self.unsupported(),
        )

    def unsupported(self) -> tuple[str, ...] | None:
        """What the spec cannot describe, named: a failed analysis of the
        model's structure, or a computation field no source could classify
        (its default would be a guess). Checkpoint layout fields and the
        epsilon's config key are not computations (a wrong guess fails to
        load, or reads the same value)."""
        items: list[str] = list(self.unsupported_features() or ())
        for name in ANALYSIS_FAILURES:
            finding = self.code_finding(name)
            if finding is not None and not finding.known:
                items.append(f"{name}: {_short(finding.evidence)}")
        if not any(item.split(":", 1)[0] in ANALYSIS_FAILURES for item in items):
            for name in sorted(set(self.unknown)):
                if name.startswith("checkpoint.") or name in NOT_COMPUTATIONS:
                    continue
                evidence = next((d.evidence for d in reversed(self.decisions) if d.field == name), "")
                items.append(f"{name}: {_short(evidence)}")
        for name in CONFIG_READ_SIZES:
            cfg, code = self.cfg_finding(name), self.code_finding(name)
            if cfg is not None and code is not None and cfg.known and code.known and cfg.source == CONFIG \
                    and cfg.value is not None and code.value is not None and cfg.value != code.value:
                items.append(f"{name}: the code builds {code.value} where the config says {cfg.value} "
                             f"({_short(code.evidence, 100)}); a port reads the config's value")
        for name, what in FEATURE_FINDINGS.items():
            finding = self.code_finding(name)
            if finding is not None and finding.known and finding.value:
                items.append(f"{what}: {_short(finding.evidence)}")
        if not items:
            return None
        self.decisions.append(known(tuple(items), "unsupported", DERIVED,
                                    f"{len(items)} computation(s) the spec cannot describe"))
        return tuple(items)

    def checkpoint_layout(self, is_moe: bool, tied: bool) -> CheckpointSpec:
        """How the weights are stored: the checkpoint's own tensors when there
        is one (module names from the code, shapes from the header), else the
        tensors the code creates."""
        code, ckpt = self.code, self.ckpt
        stored = ckpt.tensors if ckpt is not None else None

        def fusion(field: str, code_flag: str, modules: list[str], ckpt_flag: str) -> str:
            flag = self.code_finding(code_flag)
            fused_code = bool(flag.value) if flag is not None and flag.known else None
            if stored is not None:
                if code is not None and modules and all(f"{m}.weight" in stored for m in modules) \
                        and fused_code is not None:
                    value = "fused" if fused_code else "separate"
                    self.decisions.append(known(value, field, CHECKPOINT,
                                                f"stored as {', '.join(m + '.weight' for m in modules)}"))
                    return value
                f = self.ckpt_finding(ckpt_flag)
                if f is not None and f.known:
                    value = "fused" if f.value else "separate"
                    self.decisions.append(known(value, field, CHECKPOINT, f.evidence, f.confidence))
                    return value
            if fused_code is not None and (stored is None or code is not None):
                value = "fused" if fused_code else "separate"
                self.decisions.append(known(value, field, CODE, flag.evidence,
                                            INFERRED if stored is not None else flag.confidence))
                return value
            self.decisions.append(unknown(field, DERIVED, "neither the code nor the checkpoint shows the layout"))
            self.unknown.append(field)
            return "separate"

        qkv = fusion("checkpoint.qkv", "code.fused_qkv", code.qkv_modules if code else [], "checkpoint.fused_qkv")
        layout = self.code_finding("code.qkv_layout")
        if qkv == "fused" and layout is not None and layout.known and layout.value == "per_head_interleaved":
            qkv = "fused_per_head"
            self.decisions.append(known(qkv, "checkpoint.qkv", CODE,
                                        f"{layout.evidence}: the fused tensor's rows are [q k v] per head"))
        gate_modules = [] if is_moe else (code.mlp_modules if code else [])
        if is_moe and stored is not None:
            layout = self.ckpt_finding("checkpoint.expert_layout")
            if layout is not None and layout.value == "per_expert":
                gate_modules = []  # per-expert keys: decided by shapes below
        gate_up = fusion("checkpoint.gate_up", "code.fused_gate_up", gate_modules, "checkpoint.fused_gate_up")
        if is_moe and stored is not None and self.ckpt_finding("checkpoint.fused_gate_up") is None:
            layout = self.ckpt_finding("checkpoint.expert_layout")
            if layout is not None and layout.value == "per_expert":
                gate_up = "separate"
                self.decisions.append(known("separate", "checkpoint.gate_up", CHECKPOINT,
                                            f"{layout.evidence}: no tensor of width 2 x expert intermediate"))
        head_stored = None
        if stored is not None:
            if code is not None and code.head_key is not None:
                head_stored = code.head_key in stored
                evidence = f"{code.head_key} {'is' if head_stored else 'is not'} stored"
            else:
                f = self.ckpt_finding("checkpoint.lm_head_stored")
                head_stored = f.value if f is not None and f.known else None
                evidence = f.evidence if f is not None else "no vocabulary matrix found"
            self.decisions.append(known(head_stored, "checkpoint.lm_head_stored", CHECKPOINT, evidence))
        key_map = self.key_map(qkv, gate_up, is_moe)
        layout = self.linear_layout()
        return CheckpointSpec(qkv=qkv, gate_up=gate_up, lm_head_stored=head_stored, key_map=key_map,
                              linear_layout=layout)

    def key_map(self, qkv: str, gate_up: str, is_moe: bool) -> dict[str, str] | None:
        """Renames from the Llama-style module paths to the ones the code
        builds, checked against the stored tensor names."""
        code = self.code
        if code is None or not code.module_names:
            self.decisions.append(unknown("checkpoint.key_map", DERIVED, "no module tree to read names from"))
            self.unknown.append("checkpoint.key_map")
            return None
        names = dict(code.module_names)
        if is_moe:  # expert and router keys are the MoE codemods' business
            names = {k: v for k, v in names.items() if k != "mlp" and not k.startswith("mlp.")}
        missing = self.missing_names(names, qkv, gate_up, is_moe)
        key_map = derive_key_map(names)
        shown = ", ".join(f"{k} -> {v}" for k, v in (key_map or {}).items()) or "Llama-style names"
        if missing:
            self.decisions.append(unknown("checkpoint.key_map", CODE,
                                          f"module names not identified for {', '.join(missing)} ({shown})"))
            self.unknown.append("checkpoint.key_map")
            return key_map
        evidence = f"module paths the code builds: {shown}"
        if self.ckpt is not None:
            stored = self.ckpt.tensors
            absent = []
            for key in canonical_keys(names):
                actual = rename(key, key_map or {})
                wanted = [k for k in (f"{actual}.weight", f"{actual}.bias") if k in code.expected]
                if key == "lm_head" and self.code.tied_keys_declared:
                    continue
                absent += [k for k in wanted if k not in stored]
            if absent:
                self.conflict("checkpoint.key_map", [
                    (CODE, key_map, evidence),
                    (CHECKPOINT, "absent", f"not stored: {', '.join(absent[:6])}")],
                    "the spec follows the code's module names; the checkpoint stores other names")
            else:
                evidence += "; every renamed key is stored"
        self.decisions.append(known(key_map, "checkpoint.key_map", CODE if self.ckpt is None else CHECKPOINT,
                                    evidence))
        return key_map

    def missing_names(self, names: dict[str, str], qkv: str, gate_up: str, is_moe: bool) -> list[str]:
        """Canonical modules a port of this model loads whose names the
        code analysis did not identify."""
        spec_qk = self.code_finding("attention.qk_norm")
        placement = self.code_finding("norm.placement")
        parallel = self.code_finding("residual.parallel")
        kind = self.code_finding("mlp.kind")
        affine = self.code_finding("code.norm_affine")
        wanted = ["model", "model.layers", "model.embed_tokens", "lm_head", "self_attn", "self_attn.o_proj"]
        fused = qkv in ("fused", "fused_per_head")
        wanted += ["self_attn.qkv_proj"] if fused else ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"]
        if spec_qk is not None and spec_qk.known and spec_qk.value != "none" and not fused:
            wanted += ["self_attn.q_norm", "self_attn.k_norm"]
        if not is_moe:
            wanted += ["mlp", "mlp.down_proj"]
            if gate_up == "fused":
                wanted.append("mlp.gate_up_proj")
            else:
                wanted += ["mlp.up_proj"] + (["mlp.gate_proj"] if kind is not None and kind.value == "gated" else [])
        if affine is None or affine.value is not False:
            wanted.append("model.norm")
            where = placement.value if placement is not None and placement.known else None
            if where == "pre":
                wanted.append("input_layernorm")
                if parallel is None or parallel.value != "shared_norm":
                    wanted.append("post_attention_layernorm")
            elif where == "sandwich":
                wanted += ["input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                           "post_feedforward_layernorm"]
            elif where == "post":
                wanted += ["post_attention_layernorm", "post_feedforward_layernorm"]
        return [w for w in wanted if not names.get(w)]

    def linear_layout(self) -> str:
        code = self.code
        kinds = set(code.linear_modules) if code is not None else set()
        if kinds == {"Conv1D"}:
            self.decisions.append(known("in_out", "checkpoint.linear_layout", CODE,
                                        "the layer projections are transformers Conv1D (weights [in, out])"))
            return "in_out"
        if kinds == {"Linear"} or not kinds:
            return "out_in"
        self.decisions.append(unknown("checkpoint.linear_layout", CODE,
                                      f"the layer projections mix module kinds {sorted(kinds)}"))
        self.unknown.append("checkpoint.linear_layout")
        return "out_in"

    def count(self, name: str, config_value: Any) -> Any:
        """A head count: the config's, unless the code builds another."""
        code = self.code_finding(name)
        cfg = self.cfg_finding(name)
        if code is not None and code.known:
            if config_value is not None and code.value != config_value:
                self.conflict(name, [(CONFIG, config_value, cfg.evidence if cfg else ""),
                                     (CODE, code.value, code.evidence)],
                              f"the spec takes {code.value}: the projections the code builds")
            self.decisions.append(code)
            return code.value
        if cfg is not None:
            self.decisions.append(cfg)
        return config_value

    def eps(self) -> float | None:
        value = self.value("norm.eps")
        return value if value is not None else self.code_value("norm.eps")

    def eps_key(self) -> str:
        code = self.code_finding("norm.eps_key")
        cfg = self.cfg_finding("norm.eps_key")
        if code is not None and code.known:
            if cfg is not None and cfg.known and cfg.value != code.value:
                self.conflict("norm.eps_key", [(CONFIG, cfg.value, cfg.evidence), (CODE, code.value, code.evidence)],
                              f"the spec takes {code.value!r}: the code reads that key", "warning")
            self.decisions.append(code)
            return code.value
        return self.decide("norm.eps_key", "rms_norm_eps", (CONFIG,))

    def rope(self) -> RopeSpec:
        code_type = self.code_finding("rope.type")
        if code_type is not None and code_type.known and code_type.value == "none":
            self.decisions.append(code_type)
            return RopeSpec(type="none", theta=None, parameters=None)
        rope_type = self.decide("rope.type", "default", (CONFIG,))
        theta = self.value("rope.theta")
        parameters = self.value("rope.parameters")
        factor = self.decide("rope.partial_rotary_factor", 1.0, (CODE, CONFIG))
        style = self.decide("rope.style", "rotate_half", (CODE,))
        nope = self.decide("rope.nope_layers", None, (CODE,))
        return RopeSpec(type=rope_type, theta=theta, parameters=parameters,
                        partial_rotary_factor=float(factor), style=style, nope_layers=nope,
                        layer_parameters=self.value("rope.layer_parameters"))

    def moe(self) -> MoESpec | None:
        if self.code is None:
            experts = self.cfg.value("moe.num_experts")
            if experts:
                self.unknown.append("moe")
                self.decisions.append(unknown("moe", CONFIG, f"config has {experts} experts; no code to read routing from"))
            return None
        marker = self.code_finding("moe")
        if marker is not None and marker.known and marker.value is None:
            self.decisions.append(marker)
            experts = self.cfg.value("moe.num_experts")
            if experts:
                self.notes.append(known(experts, "config.num_experts_unused", CONFIG,
                                        f"config sets {experts} experts but no layer routes to experts"))
            return None
        if self.code.get("moe.num_experts") is None:
            return None
        spec = MoESpec(
            num_experts=self.decide("moe.num_experts", None, (CODE, CONFIG)),
            top_k=self.decide("moe.top_k", None, (CODE, CONFIG)),
            intermediate_size=self.decide("moe.intermediate_size", None, (CODE, CONFIG)),
            shared_experts=self.decide("moe.shared_experts", 0, (CODE,)),
            shared_expert_gate=self.decide("moe.shared_expert_gate", False, (CODE,)),
            router_activation=self.decide("moe.router_activation", "softmax", (CODE,)),
            router_bias=self.decide("moe.router_bias", False, (CODE,)),
            routing_bias=self.decide("moe.routing_bias", False, (CODE,)),
            norm_topk_prob=self.decide("moe.norm_topk_prob", False, (CODE, CONFIG)),
            routed_scaling_factor=self.decide("moe.routed_scaling_factor", None, (CODE,)),
            dense_layers=self.decide("moe.dense_layers", None, (CODE,)),
        )
        for name in ("num_experts", "top_k", "intermediate_size"):
            c, k = self.cfg_finding(f"moe.{name}"), self.code_finding(f"moe.{name}")
            if c is not None and k is not None and c.known and k.known and c.value != k.value:
                self.conflict(f"moe.{name}", [(CONFIG, c.value, c.evidence), (CODE, k.value, k.evidence)],
                              f"the spec takes {k.value}: the value the code builds")
        return spec

    def unsupported_features(self) -> tuple[str, ...] | None:
        """What the code computes that no spec field describes: every
        ``unsupported.<name>`` finding of the code analysis, as
        ``"<name>: <evidence>"`` (sorted). A plan carrying any is refused."""
        if self.code is None:
            return None
        found = {}
        for finding in self.code.findings:
            if finding.field.startswith("unsupported.") and finding.known and finding.value:
                name = finding.field[len("unsupported."):]
                found.setdefault(name, f"{name}: {finding.evidence}")
                self.decisions.append(finding)
        return tuple(found[name] for name in sorted(found)) or None

    def intermediate(self, is_moe: bool) -> int | None:
        code = self.code_finding("mlp.intermediate_size")
        if code is not None and code.known:
            self.decisions.append(code)
            return code.value
        if is_moe:
            return None
        return self.value("mlp.intermediate_size")

    def tied(self) -> bool:
        tied = self.decide("embedding.tied", False, (CONFIG,))
        if self.code is not None and tied and not self.code.tied_keys_declared:
            self.conflict("embedding.tied", [
                (CONFIG, True, "tie_word_embeddings"),
                (CODE, False, f"{self.code.causal_lm} declares no _tied_weights_keys")],
                "the spec takes False: transformers cannot tie what the class does not declare")
            tied = False
        if self.ckpt is not None:
            head_key = self.code.head_key if self.code is not None else None
            if head_key is not None:
                stored = head_key in self.ckpt.tensors
                evidence = f"{head_key} {'is' if stored else 'is not'} in the checkpoint"
            else:
                f = self.ckpt_finding("checkpoint.lm_head_stored")
                stored = f.value if f is not None else None
                evidence = f.evidence if f is not None else ""
            if stored is True and tied:
                self.conflict("embedding.tied", [(CONFIG, True, "tie_word_embeddings"),
                                                 (CHECKPOINT, "head stored", evidence)],
                              "the spec keeps tied=True: transformers ties and ignores the stored head",
                              "warning")
            elif stored is False and not tied:
                self.conflict("embedding.tied", [(CONFIG, False, "tie_word_embeddings"),
                                                 (CHECKPOINT, "no head", evidence)],
                              "the spec keeps tied=False: the head weight is missing from the checkpoint")
        return tied

    # ---- checks ----------------------------------------------------------------

    def num_layers_check(self) -> None:
        counts = []
        for source, finding in ((CONFIG, self.cfg_finding("num_layers")), (CODE, self.code_finding("num_layers")),
                                (CHECKPOINT, self.ckpt_finding("num_layers"))):
            if finding is not None and finding.known:
                counts.append((source, finding.value, finding.evidence))
        if len({v for _, v, _ in counts}) > 1:
            self.conflict("num_layers", counts, "the spec takes the config value")

    def config_code_checks(self, rope: RopeSpec) -> None:
        cfg = self.cfg_finding("rope.partial_rotary_factor")
        code = self.code_finding("rope.partial_rotary_factor")
        if cfg is not None and code is not None and cfg.known and code.known and \
                not math.isclose(cfg.value, code.value, rel_tol=1e-6):
            self.conflict("rope.partial_rotary_factor", [(CONFIG, cfg.value, cfg.evidence),
                                                         (CODE, code.value, code.evidence)],
                          f"the spec takes {code.value}: the rotary dimension the code builds")
        act = self.cfg_finding("config.activation")
        key = self.code_finding("code.activation_key")
        if act is not None and act.known and self.code is not None:
            code_act = self.code_finding("mlp.activation")
            if key is None and code_act is not None and code_act.known:
                self.notes.append(known(code_act.value, "code.activation_fixed", CODE,
                                        f"the code does not read {act.evidence}; it applies {code_act.value}"))
        window = self.cfg_finding("config.sliding_window")
        sliding = self.code_finding("attention.sliding_window")
        if window is not None and window.known and window.value and sliding is not None and sliding.known \
                and sliding.value == "none":
            self.notes.append(known(window.value, "config.sliding_window_unused", CONFIG,
                                    f"config sets sliding_window={window.value} but the code applies no window "
                                    f"({window.evidence})"))

    def checkpoint_checks(self, attention: AttentionSpec, lm_head: LMHeadSpec, embedding: EmbeddingSpec) -> None:
        code, ckpt = self.code, self.ckpt
        expected = code.expected
        stored = ckpt.tensors
        # module-level bias and presence checks, layer 0 and across layers
        groups = [
            ("attention.qkv_bias", code.qkv_modules),
            ("attention.o_bias", [code.o_module] if code.o_module else []),
            ("mlp.bias", code.mlp_modules),
            ("norm.bias", code.norm_modules),
        ]
        for field, modules in groups:
            for module in modules:
                if f"{module}.weight" not in stored:
                    continue  # the checkpoint names this module differently
                want = f"{module}.bias" in expected
                have = f"{module}.bias" in stored
                if want != have:
                    self.conflict(field, [
                        (CODE, want, f"{module}: the code creates {'a' if want else 'no'} bias"),
                        (CHECKPOINT, have, f"{module}.bias {'is' if have else 'is not'} stored")],
                        "the spec follows the code (transformers "
                        + ("drops the stored bias" if have else "leaves the bias uninitialised") + ")")
                    break
        # tensors the code does not create / creates but are not stored
        exp_patterns = {pattern(k) for k in expected}
        got_patterns = {pattern(k) for k in stored}
        extra = sorted(got_patterns - exp_patterns)
        missing = sorted(exp_patterns - got_patterns)
        if code.tied_keys_declared and embedding.tied and code.head_key in missing:
            missing.remove(code.head_key)
        if extra:
            self.notes.append(known(extra, "checkpoint.unexpected_keys", CHECKPOINT,
                                    f"{len(extra)} stored tensor pattern(s) the code does not create: "
                                    + ", ".join(extra[:6]) + (" ..." if len(extra) > 6 else "")))
        if missing:
            self.notes.append(known(missing, "checkpoint.missing_keys", CHECKPOINT,
                                    f"{len(missing)} tensor pattern(s) the code creates that are not stored: "
                                    + ", ".join(missing[:6]) + (" ..." if len(missing) > 6 else "")))
        for name in code.qk_norm_modules:
            if f"{name}.weight" in expected and f"{name}.weight" not in stored and any(
                    k.startswith(name + ".") for k in stored) is False:
                self.conflict("attention.qk_norm", [
                    (CODE, attention.qk_norm, f"{name} is applied to queries/keys"),
                    (CHECKPOINT, "absent", f"no {name}.* tensor stored")],
                    "the spec follows the code; loading leaves the norm weight at its initial value")
                break
        for name in code.sink_keys:
            if name not in stored:
                self.conflict("attention.sinks", [(CODE, True, f"{name} is passed to the kernel"),
                                                  (CHECKPOINT, False, f"{name} is not stored")],
                              "the spec follows the code")
        # shapes
        mismatched = []
        for key, shape in expected.items():
            got = stored.get(key)
            if got is not None and shape is not None and tuple(got.shape) != tuple(shape):
                mismatched.append(f"{key}: code {tuple(shape)}, checkpoint {tuple(got.shape)}")
        if mismatched:
            self.conflict("shapes", [(CODE, "module tree", f"{len(mismatched)} tensor(s) differ"),
                                     (CHECKPOINT, "header", "; ".join(mismatched[:4]))],
                          "sizes come from config.json; the checkpoint does not match it")

    def run(self) -> Decision:
        spec = self.build()
        return Decision(spec, self.decisions, self.conflicts, sorted(set(self.unknown)), self.notes)


def decide_spec(cfg: ConfigAnalysis, code: CodeAnalysis | None, ckpt: CheckpointHeader | None,
                ckpt_findings: list[Finding]) -> Decision:
    return _Decider(cfg, code, ckpt, ckpt_findings).run()


# ---- parameter counts ----------------------------------------------------------


def count_parameters(spec: ArchSpec, code: CodeAnalysis | None, ckpt: CheckpointHeader | None,
                     quantized: bool) -> ParameterCount:
    """Parameters, and how many of them are routed-expert weights: from the
    checkpoint header when it holds plain floating-point tensors, else from
    the code's module tree, else from the spec's dimensions."""
    if ckpt is not None and not quantized and ckpt.tensors:
        total = ckpt.parameter_count
        expert_keys = code.expert_keys if code is not None else set()
        experts = sum(t.numel for n, t in ckpt.tensors.items()
                      if n in expert_keys or ".experts." in f".{n}")
        return ParameterCount(total, experts, "checkpoint", f"{len(ckpt.tensors)} tensors in the safetensors headers")
    if code is not None and code.expected and all(s is not None for s in code.expected.values()):
        shapes = dict(code.expected)
        if spec.embedding.tied and code.head_key in shapes:
            shapes.pop(code.head_key)
        total = sum(math.prod(s) for s in shapes.values())
        experts = sum(math.prod(s) for k, s in shapes.items() if k in code.expert_keys)
        return ParameterCount(total, experts, "code", f"{len(shapes)} parameters of the module tree built from the config")
    return _formula(spec)


def _formula(spec: ArchSpec) -> ParameterCount:
    h = spec.hidden_size or 0
    layers = spec.num_layers or 0
    a = spec.attention
    nh, nkv = a.num_heads or 0, a.num_kv_heads or a.num_heads or 0
    hd = a.head_dim or (h // nh if nh else 0)
    attn = h * nh * hd + 2 * h * nkv * hd + nh * hd * h
    if a.qkv_bias:
        attn += (nh + 2 * nkv) * hd
    per_proj = 3 if spec.mlp.kind == "gated" else 2
    experts = 0
    if spec.moe is not None:
        e_int = spec.moe.intermediate_size or 0
        experts = layers * (spec.moe.num_experts or 0) * per_proj * h * e_int
        ffn = h * (spec.moe.num_experts or 0)
    else:
        ffn = per_proj * h * (spec.mlp.intermediate_size or 0)
    norms = 2 * h * (2 if spec.norm.bias else 1)
    vocab = spec.embedding.vocab_size or 0
    total = layers * (attn + ffn + norms) + experts + vocab * h * (1 if spec.embedding.tied else 2) + h
    return ParameterCount(total, experts, "config", "estimated from the spec dimensions")


def spec_replace(spec: ArchSpec, **changes: Any) -> ArchSpec:
    return dataclasses.replace(spec, **changes)
