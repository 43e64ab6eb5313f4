"""The checkpoint section of the spec and the checks against the stored
tensors: how the weights are stored (fused or separate QKV and gate/up,
whether the head is stored: the checkpoint's tensors when there is one,
else the tensors the code creates), the key map from the Llama-style module
paths to the code's, the linear layout, and the conflicts and notes where
the stored tensors differ from the ones the code creates (biases, missing
or unexpected patterns, q/k norms, sinks, shapes)."""

from __future__ import annotations

from autoport_cst.research.analysis.state import CodeAnalysis
from autoport_cst.research.checkpoint import TensorInfo, pattern
from autoport_cst.research.checkpoint_conversion import same_modules, split_of
from autoport_cst.research.checkpoint_keys import (
    FUSED_GATE_UP,
    dense_wanted,
    match_keys,
    moe_names,
    moe_wanted,
    refuse_missing,
)
from autoport_cst.research.config_keys import config_keys
from autoport_cst.research.decide.state import Decider
from autoport_cst.research.findings import CHECKPOINT, CODE, DERIVED, INFERRED, known, unknown
from autoport_cst.research.keys import derive_key_map
from autoport_cst.spec import AttentionSpec, CheckpointSpec, EmbeddingSpec, LMHeadSpec
from autoport_cst.spec.model import CheckpointFusion, LinearLayout, OutputGateLayout, QKVLayout


def layout(d: Decider, is_moe: bool) -> CheckpointSpec:
    """How the weights are stored: the checkpoint's own tensors when there
    is one (module names from the code, shapes from the header), else the
    tensors the code creates."""
    code, ckpt = d.code, d.ckpt
    stored = ckpt.tensors if ckpt is not None else None
    qkv: QKVLayout = _converted(
        d, stored, "checkpoint.qkv", code.qkv_modules if code else [], _QKV
    ) or _fusion(
        d,
        stored,
        "checkpoint.qkv",
        "code.fused_qkv",
        code.qkv_modules if code else [],
        "checkpoint.fused_qkv",
    )
    qkv_layout = d.code_finding("code.qkv_layout")
    if (
        qkv == "fused"
        and qkv_layout is not None
        and qkv_layout.known
        and qkv_layout.value == "per_head_interleaved"
    ):
        qkv = "fused_per_head"
        d.decisions.append(
            known(
                qkv,
                "checkpoint.qkv",
                CODE,
                f"{qkv_layout.evidence}: the fused tensor's rows are [q k v] per head",
            )
        )
    if qkv == "fused" and qkv_layout is not None and qkv_layout.known and qkv_layout.value == "kv_groups":
        qkv = "fused_kv_groups"
        d.decisions.append(
            known(
                qkv,
                "checkpoint.qkv",
                CODE,
                f"{qkv_layout.evidence}: the fused tensor's rows are, per KV head, its query heads, key and value",
            )
        )
    groups, order = d.code_value("code.qkv_groups"), d.code_value("code.qkv_order")
    if qkv == "fused" and qkv_layout is not None and qkv_layout.value == "grouped":
        qkv = "fused_grouped"
        d.decisions.append(
            known(qkv, "checkpoint.qkv", CODE, f"{qkv_layout.evidence}: {groups} groups of [{order}] rows")
        )
    gate_up = _gate_up(d, stored, is_moe)
    head_stored = _head_stored(d, stored)
    key_map = _key_map(d, qkv, gate_up, is_moe)
    gate_up = _experts_layout(d, gate_up)
    head_key = f"{(key_map or {}).get('lm_head')}.weight"
    if stored is not None and not head_stored and head_key in stored:
        head_stored = True  # under the checkpoint's own name (embed_out)
        d.decisions.append(known(True, "checkpoint.lm_head_stored", CHECKPOINT, f"{head_key} is stored"))
    linear = _linear_layout(d)
    return CheckpointSpec(
        qkv=qkv,
        gate_up=gate_up,
        lm_head_stored=head_stored,
        key_map=key_map,
        linear_layout=linear,
        config_keys=config_keys(d),
        qkv_groups=groups if qkv == "fused_grouped" else None,
        qkv_order=order if qkv == "fused_grouped" else None,
        output_gate=_output_gate(d),
    )


def _output_gate(d: Decider) -> OutputGateLayout:
    """Where the output gate's weights are: fused with the queries, each
    head's query rows then its gate rows, when the code splits one
    projection so (analysis/query_gate); else its own tensor."""
    if d.code_value("code.output_gate_layout") == "fused_query_per_head":
        d.decisions.append(
            known(
                "fused_query_per_head",
                "checkpoint.output_gate",
                CODE,
                "the output gate's rows are stored with the queries, per head (code.output_gate_layout)",
            )
        )
        return "fused_query_per_head"
    return "separate"


def _fusion(
    d: Decider, stored: dict | None, field: str, code_flag: str, modules: list[str], ckpt_flag: str
) -> CheckpointFusion:
    """fused or separate: the stored tensors of the code's modules, else the
    checkpoint's own finding, else the code's module tree."""
    code = d.code
    flag = d.code_finding(code_flag)
    fused_code = bool(flag.value) if flag is not None and flag.known else None
    if stored is not None:
        if (
            code is not None
            and modules
            and all(f"{m}.weight" in stored for m in modules)
            and fused_code is not None
        ):
            value = _fused_or_separate(fused_code)
            d.decisions.append(
                known(value, field, CHECKPOINT, f"stored as {', '.join(m + '.weight' for m in modules)}")
            )
            return value
        f = d.ckpt_finding(ckpt_flag)
        if f is not None and f.known:
            value = _fused_or_separate(f.value)
            d.decisions.append(known(value, field, CHECKPOINT, f.evidence, f.confidence))
            return value
    if flag is not None and fused_code is not None and (stored is None or code is not None):
        value = _fused_or_separate(fused_code)
        d.decisions.append(
            known(value, field, CODE, flag.evidence, INFERRED if stored is not None else flag.confidence)
        )
        return value
    d.decisions.append(unknown(field, DERIVED, "neither the code nor the checkpoint shows the layout"))
    d.unknown.append(field)
    return "separate"


_QKV = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")
_GATE_UP = ("mlp.gate_proj", "mlp.up_proj")


def _converted(
    d: Decider, stored: dict | None, field: str, modules: list[str], canonical: tuple[str, ...]
) -> CheckpointFusion | None:
    """The layout of tensors transformers splits at load into some of
    ``modules`` (research/checkpoint_conversion.py): fused when the chunks
    are the spec's fused rows in order, else unknown; None when no load-time
    split concerns them or the checkpoint holds the code's own tensors."""
    if (
        d.code is None
        or not modules
        or (stored is not None and all(f"{m}.weight" in stored for m in modules))
    ):
        return None
    raw = d.cfg.raw if d.cfg is not None else {}
    architectures = raw.get("architectures") or [None]
    split = split_of(raw.get("model_type"), architectures[0], modules)
    if split is None:
        return None
    wanted = [d.code.module_names.get(name, name) for name in canonical]
    rows = " | ".join(wanted)
    if split.plain and same_modules(split, wanted):
        d.decisions.append(known("fused", field, CODE, f"{split.describe()}: the fused [{rows}] rows"))
        return "fused"
    d.decisions.append(
        unknown(field, CODE, f"{split.describe()}: not the fused [{rows}] rows a spec layout describes")
    )
    d.unknown.append(field)
    return "unknown"  # never a layout the split does not have: a plan carrying it is refused


def _fused_or_separate(fused: object) -> CheckpointFusion:
    return "fused" if fused else "separate"


def _gate_up(d: Decider, stored: dict | None, is_moe: bool) -> CheckpointFusion:
    """Gate and up fused or separate; per-expert stored keys of an MoE are
    decided by the checkpoint's shapes."""
    code = d.code
    gate_modules = [] if is_moe else (code.mlp_modules if code else [])
    if is_moe and stored is not None:
        expert_layout = d.ckpt_finding("checkpoint.expert_layout")
        if expert_layout is not None and expert_layout.value == "per_expert":
            gate_modules = []  # per-expert keys: decided by shapes below
    gate_up = _converted(d, stored, "checkpoint.gate_up", gate_modules, _GATE_UP) or _fusion(
        d, stored, "checkpoint.gate_up", "code.fused_gate_up", gate_modules, "checkpoint.fused_gate_up"
    )
    if is_moe and stored is not None and d.ckpt_finding("checkpoint.fused_gate_up") is None:
        expert_layout = d.ckpt_finding("checkpoint.expert_layout")
        if expert_layout is not None and expert_layout.value == "per_expert":
            gate_up = "separate"
            d.decisions.append(
                known(
                    "separate",
                    "checkpoint.gate_up",
                    CHECKPOINT,
                    f"{expert_layout.evidence}: no tensor of width 2 x expert intermediate",
                )
            )
    return gate_up


def _experts_layout(d: Decider, gate_up: CheckpointFusion) -> CheckpointFusion:
    """Routed experts found in the header one tensor per expert are stored
    separate, stacked ones fused (``checkpoint.gate_up`` of an MoE)."""
    per_expert = d.experts_per_expert
    if per_expert is None:
        return gate_up
    value = _fused_or_separate(not per_expert)
    if value != gate_up:
        d.decisions.append(
            known(
                value,
                "checkpoint.gate_up",
                CHECKPOINT,
                "the routed experts are stored " + ("one tensor per expert" if per_expert else "stacked"),
            )
        )
    return value


def _head_stored(d: Decider, stored: dict | None) -> bool | None:
    code = d.code
    head_stored = None
    if stored is not None:
        if code is not None and code.head_key is not None:
            head_stored = code.head_key in stored
            evidence = f"{code.head_key} {'is' if head_stored else 'is not'} stored"
        else:
            f = d.ckpt_finding("checkpoint.lm_head_stored")
            head_stored = f.value if f is not None and f.known else None
            evidence = f.evidence if f is not None else "no vocabulary matrix found"
        d.decisions.append(known(head_stored, "checkpoint.lm_head_stored", CHECKPOINT, evidence))
    return head_stored


def _key_map(d: Decider, qkv: str, gate_up: str, is_moe: bool) -> dict[str, str] | None:
    """Renames from the Llama-style module paths to the ones the code
    builds, checked against the stored tensor names."""
    code = d.code
    if code is None or not code.module_names:
        d.decisions.append(unknown("checkpoint.key_map", DERIVED, "no module tree to read names from"))
        d.unknown.append("checkpoint.key_map")
        return None
    names = dict(code.module_names)
    if is_moe:  # expert and router keys are the MoE codemods' business
        names = {k: v for k, v in names.items() if k != "mlp" and not k.startswith("mlp.")}
    missing = _missing_names(d, names, qkv, gate_up, is_moe)
    key_map = derive_key_map(names)
    shown = ", ".join(f"{k} -> {v}" for k, v in (key_map or {}).items()) or "Llama-style names"
    if missing:
        d.decisions.append(
            unknown(
                "checkpoint.key_map", CODE, f"module names not identified for {', '.join(missing)} ({shown})"
            )
        )
        d.unknown.append("checkpoint.key_map")
        return key_map
    evidence = f"module paths the code builds: {shown}"
    if d.ckpt is not None:
        key_map, evidence = _stored_key_map(d, names, key_map, is_moe, shown)
    d.decisions.append(known(key_map, "checkpoint.key_map", CODE if d.ckpt is None else CHECKPOINT, evidence))
    return key_map


def _stored_key_map(
    d: Decider, names: dict[str, str], key_map: dict[str, str] | None, is_moe: bool, shown: str
) -> tuple[dict[str, str] | None, str]:
    """The key map read from the checkpoint's header: every tensor the port
    loads looked up under the code's name, else by structure
    (``research.key_match``); a tensor without a key refuses the plan."""
    code, ckpt = d.code, d.ckpt
    assert code is not None and ckpt is not None  # _key_map reads the header with both
    tied = d.cfg.value("embedding.tied")
    # a tied head loads the embedding (config.json says so; the class's
    # declared tying only when config.json says nothing)
    skip_head = tied is True or (tied is None and bool(code.tied_keys_declared))
    wanted = dense_wanted(code, names, key_map or {}, skip_head)
    moe_layer = moe_names(code, None) if is_moe else None
    all_names = dict(names)
    if moe_layer is not None:
        layer, moe = moe_layer
        experts = d.code_finding("moe.num_experts")
        routing = d.code_finding("moe.routing_bias")
        count = experts.value if experts is not None and experts.known else None
        wanted += moe_wanted(
            code, layer, moe, bool(routing is not None and routing.known and routing.value), count or 0
        )
        all_names.update(moe)
    match = match_keys(wanted, ckpt.tensors, code.expected)
    refuse_missing(match, ckpt.directory, ckpt.files, code.causal_lm or "the model")
    if moe_layer is not None and any(w.canonical == FUSED_GATE_UP for w in wanted):
        d.experts_per_expert = match.per_expert
    stored_names = {**all_names, **match.modules}
    if moe_layer is not None and not match.per_expert:
        stored_names.pop("mlp.experts", None)
    stored_map = derive_key_map(stored_names)
    shown = ", ".join(f"{k} -> {v}" for k, v in (stored_map or {}).items()) or "Llama-style names"
    evidence = f"the key of every tensor a port loads, read from the header: {shown}"
    if match.evidence:
        evidence += " (" + "; ".join(match.evidence[:4]) + ")"
    return stored_map, evidence


def _missing_names(d: Decider, names: dict[str, str], qkv: str, gate_up: str, is_moe: bool) -> list[str]:
    """Canonical modules a port of this model loads whose names the
    code analysis did not identify."""
    spec_qk = d.code_finding("attention.qk_norm")
    placement = d.code_finding("norm.placement")
    parallel = d.code_finding("residual.parallel")
    kind = d.code_finding("mlp.kind")
    affine = d.code_finding("code.norm_affine")
    wanted = ["model", "model.layers", "model.embed_tokens", "lm_head", "self_attn", "self_attn.o_proj"]
    fused = qkv in ("fused", "fused_per_head", "fused_grouped", "fused_kv_groups")
    wanted += (
        ["self_attn.qkv_proj"] if fused else ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"]
    )
    qk_affine = d.code_finding("attention.qk_norm_affine")
    weightless = qk_affine is not None and qk_affine.known and qk_affine.value is False
    if spec_qk is not None and spec_qk.known and spec_qk.value != "none" and not fused and not weightless:
        wanted += ["self_attn.q_norm", "self_attn.k_norm"]
    if not is_moe:
        wanted += ["mlp", "mlp.down_proj"]
        if gate_up == "fused":
            wanted.append("mlp.gate_up_proj")
        else:
            wanted += ["mlp.up_proj"] + (
                ["mlp.gate_proj"] if kind is not None and kind.value == "gated" else []
            )
    if affine is None or affine.value is not False:
        wanted.append("model.norm")
        where = placement.value if placement is not None and placement.known else None
        if where == "pre":
            wanted.append("input_layernorm")
            if parallel is None or parallel.value != "shared_norm":
                wanted.append("post_attention_layernorm")
        elif where == "sandwich":
            wanted += [
                "input_layernorm",
                "post_attention_layernorm",
                "pre_feedforward_layernorm",
                "post_feedforward_layernorm",
            ]
        elif where == "post":
            wanted += ["post_attention_layernorm", "post_feedforward_layernorm"]
    # an MLP named "" is computed by the decoder layer itself (its projections are the layer's)
    return [w for w in wanted if not names.get(w) and not (w == "mlp" and names.get(w) == "")]


def _linear_layout(d: Decider) -> LinearLayout:
    code = d.code
    kinds = set(code.linear_modules) if code is not None else set()
    if kinds == {"Conv1D"}:
        d.decisions.append(
            known(
                "in_out",
                "checkpoint.linear_layout",
                CODE,
                "the layer projections are transformers Conv1D (weights [in, out])",
            )
        )
        return "in_out"
    if kinds == {"Linear"} or not kinds:
        return "out_in"
    d.decisions.append(
        unknown("checkpoint.linear_layout", CODE, f"the layer projections mix module kinds {sorted(kinds)}")
    )
    d.unknown.append("checkpoint.linear_layout")
    return "out_in"


def checks(d: Decider, attention: AttentionSpec, lm_head: LMHeadSpec, embedding: EmbeddingSpec) -> None:
    """The stored tensors against the ones the code creates (with both)."""
    code, ckpt = d.code, d.ckpt
    if code is None or ckpt is None:
        return
    _bias_checks(d, code, ckpt.tensors)
    _pattern_notes(d, code, ckpt.tensors, embedding)
    _qk_norm_and_sinks(d, code, ckpt.tensors, attention)
    _shapes(d, code, ckpt.tensors)


def _bias_checks(d: Decider, code: CodeAnalysis, stored: dict[str, TensorInfo]) -> None:
    """Module-level bias presence: a bias the code creates but the
    checkpoint lacks, or stores but the code does not create."""
    expected = code.expected
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
                d.conflict(
                    field,
                    [
                        (CODE, want, f"{module}: the code creates {'a' if want else 'no'} bias"),
                        (CHECKPOINT, have, f"{module}.bias {'is' if have else 'is not'} stored"),
                    ],
                    "the spec follows the code (transformers "
                    + ("drops the stored bias" if have else "leaves the bias uninitialised")
                    + ")",
                )
                break


def _pattern_notes(
    d: Decider, code: CodeAnalysis, stored: dict[str, TensorInfo], embedding: EmbeddingSpec
) -> None:
    """Tensor patterns stored but not created, or created but not stored."""
    exp_patterns = {pattern(k) for k in code.expected}
    got_patterns = {pattern(k) for k in stored}
    extra = sorted(got_patterns - exp_patterns)
    missing = sorted(exp_patterns - got_patterns)
    if code.tied_keys_declared and embedding.tied and code.head_key in missing:
        missing.remove(code.head_key)
    if extra:
        d.notes.append(
            known(
                extra,
                "checkpoint.unexpected_keys",
                CHECKPOINT,
                f"{len(extra)} stored tensor pattern(s) the code does not create: "
                + ", ".join(extra[:6])
                + (" ..." if len(extra) > 6 else ""),
            )
        )
    if missing:
        d.notes.append(
            known(
                missing,
                "checkpoint.missing_keys",
                CHECKPOINT,
                f"{len(missing)} tensor pattern(s) the code creates that are not stored: "
                + ", ".join(missing[:6])
                + (" ..." if len(missing) > 6 else ""),
            )
        )


def _qk_norm_and_sinks(
    d: Decider, code: CodeAnalysis, stored: dict[str, TensorInfo], attention: AttentionSpec
) -> None:
    expected = code.expected
    for name in code.qk_norm_modules:
        if (
            f"{name}.weight" in expected
            and f"{name}.weight" not in stored
            and any(k.startswith(name + ".") for k in stored) is False
        ):
            d.conflict(
                "attention.qk_norm",
                [
                    (CODE, attention.qk_norm, f"{name} is applied to queries/keys"),
                    (CHECKPOINT, "absent", f"no {name}.* tensor stored"),
                ],
                "the spec follows the code; loading leaves the norm weight at its initial value",
            )
            break
    for name in code.sink_keys:
        if name not in stored:
            d.conflict(
                "attention.sinks",
                [
                    (CODE, True, f"{name} is passed to the kernel"),
                    (CHECKPOINT, False, f"{name} is not stored"),
                ],
                "the spec follows the code",
            )


def _shapes(d: Decider, code: CodeAnalysis, stored: dict[str, TensorInfo]) -> None:
    mismatched = []
    for key, shape in code.expected.items():
        got = stored.get(key)
        if got is not None and shape is not None and tuple(got.shape) != tuple(shape):
            mismatched.append(f"{key}: code {tuple(shape)}, checkpoint {tuple(got.shape)}")
    if mismatched:
        d.conflict(
            "shapes",
            [
                (CODE, "module tree", f"{len(mismatched)} tensor(s) differ"),
                (CHECKPOINT, "header", "; ".join(mismatched[:4])),
            ],
            "sizes come from config.json; the checkpoint does not match it",
        )
