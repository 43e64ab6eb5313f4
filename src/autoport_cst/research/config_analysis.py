"""What config.json says: sizes, the architecture string, norm epsilon (and
the key that holds it), RoPE in both the ``rope_scaling`` + ``rope_theta``
form and the ``rope_parameters`` form, activation, tying, bias flags,
sliding window and per-layer types, MoE fields, multipliers.

The file is read as JSON (positions of syntax errors are reported). When
transformers is installed the configuration class of the ``model_type`` is
also instantiated, so that values config.json leaves out take the class
defaults that the modeling code will see; findings say which of the two a
value came from. The names below are Hugging Face config keys (the
vocabulary of config.json), not model names.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autoport_cst.config_json import config_object, parse_config_text
from autoport_cst.errors import InputError, Position, did_you_mean
from autoport_cst.research.findings import CONFIG, DERIVED, INFERRED, Finding, known, unknown

EPS_KEYS = ("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "norm_epsilon", "norm_eps", "epsilon")
ACTIVATION_KEYS = ("hidden_act", "hidden_activation", "activation_function")
LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
HIDDEN_KEYS = ("hidden_size", "n_embd", "d_model")
HEAD_KEYS = ("num_attention_heads", "n_head", "num_heads")
KV_KEYS = ("num_key_value_heads", "num_kv_heads", "multi_query_group_num")
INTERMEDIATE_KEYS = ("intermediate_size", "ffn_hidden_size", "n_inner", "ffn_dim")
POSITION_KEYS = ("max_position_embeddings", "n_positions", "seq_length")
EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")
TOPK_KEYS = ("num_experts_per_tok", "moe_topk", "top_k")
MOE_INTERMEDIATE_KEYS = ("moe_intermediate_size", "expert_intermediate_size")
SHARED_KEYS = ("shared_expert_intermediate_size", "n_shared_experts", "num_shared_experts")
MULTIPLIER_KEYS = (
    "embedding_multiplier",
    "residual_multiplier",
    "attention_multiplier",
    "logits_scaling",
    "final_logit_softcapping",
    "attn_logit_softcapping",
    "query_pre_attn_scalar",
    "logit_scale",
)
ROPE_META_KEYS = ("rope_type", "type", "rope_theta", "partial_rotary_factor")
ROPE_TYPES = {"default", "llama3", "linear", "dynamic", "yarn", "longrope", "none"}
ROPE_ALIASES = {"su": "longrope", "ntk": "dynamic"}


@dataclass
class ConfigAnalysis:
    path: str
    raw: dict[str, Any]
    model_type: str
    architecture: str | None
    resolved: Any = None  # the transformers configuration object, when available
    findings: list[Finding] = field(default_factory=list)
    dims: dict[str, Any] = field(default_factory=dict)

    def get(self, name: str) -> Finding | None:
        for finding in reversed(self.findings):
            if finding.field == name:
                return finding
        return None

    def value(self, name: str, default: Any = None) -> Any:
        finding = self.get(name)
        return finding.value if finding is not None and finding.known else default


def read_config(path: str | Path) -> dict[str, Any]:
    """config.json as a dict; InputError with a position on any problem."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{path}: no config.json (a checkpoint directory must contain one)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read {path}: {exc}") from None
    try:
        data = parse_config_text(text)  # tagged floats decoded, as transformers reads it
    except json.JSONDecodeError as exc:
        raise InputError(f"malformed JSON: {exc.msg}", Position(str(path), exc.lineno, exc.colno)) from None
    if not isinstance(data, dict):
        raise InputError("config.json must hold a JSON object", Position(str(path), json_path="$"))
    model_type = data.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise InputError(
            "no model_type: cannot tell which modeling code computes this model",
            Position(str(path), json_path="$.model_type"),
        )
    architectures = data.get("architectures")
    if architectures is not None and (
        not isinstance(architectures, list) or not all(isinstance(a, str) for a in architectures)
    ):
        raise InputError("expected a list of class names", Position(str(path), json_path="$.architectures"))
    return data


def resolve_config(raw: dict[str, Any], path: str) -> Any:
    """The transformers configuration object for ``raw`` (class defaults
    filled in), or None when transformers is not installed."""
    try:
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    except ImportError:
        return None
    model_type = raw["model_type"]
    if model_type not in CONFIG_MAPPING:
        raise InputError(
            f"model_type {model_type!r} is not known to the installed transformers: no modeling source"
            + did_you_mean(model_type, CONFIG_MAPPING),
            Position(path, json_path="$.model_type"),
        )
    values = {k: v for k, v in raw.items() if k not in ("model_type", "transformers_version")}
    try:
        return config_object({**values, "model_type": model_type})
    except Exception as exc:  # the config class rejected a value
        raise InputError(
            f"transformers cannot build a {model_type} configuration: {exc}", Position(path)
        ) from None


# what the top level of a model delegating to a text model says of the model as a
# whole: its identity, the tying of its head to the embeddings, its dtype and quantization
_TOP_LEVEL_KEYS = (
    "model_type",
    "architectures",
    "tie_word_embeddings",
    "torch_dtype",
    "dtype",
    "quantization_config",
)


def text_model_config(raw: dict[str, Any], resolved: Any) -> tuple[dict[str, Any], Any]:
    """The config.json values and configuration the model's text model reads:
    ``raw`` and ``resolved`` themselves, or, where the configuration's
    ``get_text_config()`` is a sub-config (Fuyu's Persimmon ``text_config``,
    the Gemma 4 assistant's text model), that sub-config's values with the
    top level's identity, tying, dtype and quantization."""
    text = getattr(resolved, "get_text_config", None)
    sub = text() if callable(text) else resolved
    if sub is None or sub is resolved or not isinstance(raw.get("text_config"), dict):
        return raw, resolved
    values = {k: v for k, v in raw["text_config"].items() if k not in ("model_type", "architectures")}
    values.update({k: raw[k] for k in _TOP_LEVEL_KEYS if k in raw})
    return values, sub


def _lookup(raw: dict[str, Any], resolved: Any, keys: tuple[str, ...]) -> tuple[str | None, Any, str]:
    """First key present: (key, value, where) with where = 'config.json' or
    'class default'."""
    for key in keys:
        if key in raw and raw[key] is not None:
            return key, raw[key], "config.json"
    if resolved is not None:
        for key in keys:
            value = _attr(resolved, key)
            if value is not None and not callable(value):
                return key, value, f"{type(resolved).__name__} default"
    return None, None, ""


@dataclass
class _Reader:
    """config.json and its resolved configuration, read into findings."""

    raw: dict[str, Any]
    resolved: Any
    add: Callable[[Finding], None]

    def lookup(self, keys: tuple[str, ...]) -> tuple[str | None, Any, str]:
        return _lookup(self.raw, self.resolved, keys)

    def value(self, name: str, keys: tuple[str, ...], required: bool = True) -> Any:
        """The first of ``keys`` present, as the finding ``name`` (an unknown
        one when none is and ``required``)."""
        key, v, where = self.lookup(keys)
        if key is None:
            if required:
                self.add(unknown(name, CONFIG, f"none of {', '.join(keys)} in config.json"))
            return None
        confidence = "certain" if where == "config.json" else INFERRED
        self.add(known(v, name, CONFIG, f"{key} ({where})", confidence=confidence))
        return v

    def default(self, key: str) -> Any:
        """``key`` of the resolved configuration (None without one)."""
        return _attr(self.resolved, key) if self.resolved is not None else None


def analyze_config(raw: dict[str, Any], resolved: Any, path: str) -> ConfigAnalysis:
    """The findings of config.json (and the class defaults of ``resolved``),
    section by section, and the model's sizes (``dims``)."""
    architectures = raw.get("architectures") or []
    result = ConfigAnalysis(
        path, raw, raw["model_type"], architectures[0] if architectures else None, resolved
    )
    read = _Reader(raw, resolved, result.findings.append)
    _architecture(read, architectures)
    hidden = read.value("hidden_size", HIDDEN_KEYS)
    layers = read.value("num_layers", LAYER_KEYS)
    heads = read.value("attention.num_heads", HEAD_KEYS)
    kv = _kv_heads(read, heads)
    head_dim = _head_dim(read, hidden, heads)
    vocab = read.value("embedding.vocab_size", ("vocab_size", "padded_vocab_size"))
    read.value("max_position_embeddings", POSITION_KEYS, required=False)
    intermediate = read.value("mlp.intermediate_size", INTERMEDIATE_KEYS, required=False)
    _norm_eps(read)
    _rope(raw, resolved, head_dim, read.add)
    _activation(read)
    _tied_embeddings(read)
    _bias_flags(read)
    _sliding(raw, resolved, layers, read.add)
    experts, moe_intermediate = _moe(read)
    _multipliers(read)
    _dtype_and_quantization(read)
    result.dims = {
        "hidden_size": hidden,
        "num_layers": layers,
        "num_heads": heads,
        "num_kv_heads": kv,
        "head_dim": head_dim,
        "vocab_size": vocab,
        "intermediate_size": intermediate,
        "moe_intermediate_size": moe_intermediate,
        "num_experts": experts,
    }
    return result


def _architecture(read: _Reader, architectures: list[str]) -> None:
    if architectures and architectures[0]:
        extra = f" (also lists {architectures[1:]})" if len(architectures) > 1 else ""
        read.add(known(architectures[0], "architecture", CONFIG, f"architectures[0]{extra}"))
    else:
        read.add(unknown("architecture", CONFIG, "config.json has no architectures list"))


def _kv_heads(read: _Reader, heads: Any) -> Any:
    """The KV head count; without one, one KV head per query head."""
    kv_key, kv, kv_where = read.lookup(KV_KEYS)
    if kv is None and heads is not None:
        evidence = "no KV head count: one KV head per query head (MHA)"
        read.add(known(heads, "attention.num_kv_heads", CONFIG, evidence, confidence=INFERRED))
        return heads
    if kv is not None:
        read.add(known(kv, "attention.num_kv_heads", CONFIG, f"{kv_key} ({kv_where})"))
    return kv


def _head_dim(read: _Reader, hidden: Any, heads: Any) -> int | None:
    """``head_dim`` as configured, or hidden size / heads."""
    head_dim = read.raw.get("head_dim")
    if head_dim is None:
        head_dim = read.default("head_dim")
    if isinstance(head_dim, int):
        where = " (config.json)" if "head_dim" in read.raw else " (class default)"
        read.add(known(head_dim, "attention.head_dim", CONFIG, "head_dim" + where))
        return head_dim
    if isinstance(hidden, int) and isinstance(heads, int) and heads:
        evidence = f"no head_dim: hidden_size {hidden} / {heads} heads"
        read.add(known(hidden // heads, "attention.head_dim", DERIVED, evidence))
        return hidden // heads
    read.add(unknown("attention.head_dim", CONFIG, "no head_dim and no hidden_size / heads"))
    return None


def _norm_eps(read: _Reader) -> None:
    """The norm epsilon, the key that holds it, and other epsilon keys."""
    eps_key, eps, eps_where = read.lookup(EPS_KEYS)
    if eps_key is None:
        read.add(unknown("norm.eps", CONFIG, f"none of {', '.join(EPS_KEYS)}"))
        return
    read.add(known(float(eps), "norm.eps", CONFIG, f"{eps_key} ({eps_where})"))
    read.add(known(eps_key, "norm.eps_key", CONFIG, f"the epsilon is config.{eps_key}"))
    others = [k for k in EPS_KEYS if k in read.raw and k != eps_key]
    if others:
        read.add(known(others, "config.other_eps_keys", CONFIG, f"config.json also holds {others}", INFERRED))


def _activation(read: _Reader) -> None:
    act_key, act, where = read.lookup(ACTIVATION_KEYS)
    if act_key is None:
        read.add(unknown("config.activation", CONFIG, f"none of {', '.join(ACTIVATION_KEYS)}"))
    else:
        read.add(known(act, "config.activation", CONFIG, f"{act_key} ({where})"))


def _tied_embeddings(read: _Reader) -> None:
    tie = read.raw.get("tie_word_embeddings")
    where = "config.json"
    if tie is None and read.resolved is not None:
        tie, where = read.default("tie_word_embeddings"), "class default"
    if isinstance(tie, bool):
        confidence = "certain" if where == "config.json" else INFERRED
        read.add(
            known(tie, "embedding.tied", CONFIG, f"tie_word_embeddings ({where})", confidence=confidence)
        )
    else:
        read.add(unknown("embedding.tied", CONFIG, "no tie_word_embeddings"))


def _bias_flags(read: _Reader) -> None:
    """Every boolean ``*bias*`` key, from config.json or the class defaults."""
    for key in sorted(set(read.raw) | set(_resolved_keys(read.resolved))):
        if "bias" in key and not key.startswith("_"):
            v = read.raw.get(key, read.default(key))
            if isinstance(v, bool):
                where = "config.json" if key in read.raw else "class default"
                read.add(known(v, f"config.{key}", CONFIG, f"{key} ({where})"))


def _moe(read: _Reader) -> tuple[Any, Any]:
    """(expert count, expert intermediate size); the routing fields with experts."""
    experts = read.value("moe.num_experts", EXPERT_KEYS, required=False)
    if not experts:
        return experts, None
    read.value("moe.top_k", TOPK_KEYS, required=False)
    moe_intermediate = read.value("moe.intermediate_size", MOE_INTERMEDIATE_KEYS, required=False)
    read.value("config.shared_experts", SHARED_KEYS, required=False)
    read.value("moe.norm_topk_prob", ("norm_topk_prob",), required=False)
    read.value("config.decoder_sparse_step", ("decoder_sparse_step",), required=False)
    read.value("config.mlp_only_layers", ("mlp_only_layers",), required=False)
    return experts, moe_intermediate


def _multipliers(read: _Reader) -> None:
    for key in MULTIPLIER_KEYS:
        k, v, where = read.lookup((key,))
        if k is not None:
            read.add(known(v, f"config.{key}", CONFIG, f"{key} ({where})"))


def _dtype_and_quantization(read: _Reader) -> None:
    raw = read.raw
    dtype = raw.get("torch_dtype", raw.get("dtype"))
    if dtype is not None:
        read.add(known(str(dtype), "config.dtype", CONFIG, "torch_dtype / dtype"))
    quantization = raw.get("quantization_config")
    if quantization:
        method = quantization.get("quant_method") if isinstance(quantization, dict) else None
        read.add(known(method or "yes", "config.quantization", CONFIG, "quantization_config is set"))


def _attr(obj: Any, key: str) -> Any:
    try:
        return getattr(obj, key, None)
    except Exception:  # a config that refuses the access (per-layer attributes)
        return None


def _resolved_keys(resolved: Any) -> list[str]:
    if resolved is None:
        return []
    try:
        return list(resolved.to_dict())
    except Exception:  # pragma: no cover - defensive
        return []


def _rope(raw: dict, resolved: Any, head_dim: int | None, add) -> None:
    """RoPE's type, theta, scaling parameters and partial rotary factor, and
    the form config.json gives them in."""
    form, source = _rope_source(raw, resolved)
    form, source = _per_layer_type(form, source, add)
    theta = source.get("rope_theta", raw.get("rope_theta"))
    if theta is None and resolved is not None and isinstance(_attr(resolved, "rope_parameters"), dict):
        theta = resolved.rope_parameters.get("rope_theta")
    rope_type = source.get("rope_type", source.get("type")) or "default"
    rope_type = ROPE_ALIASES.get(rope_type, rope_type)
    if form is None:
        add(unknown("rope.type", CONFIG, "no rope_parameters, rope_scaling or rope_theta"))
    elif rope_type in ROPE_TYPES:
        add(known(rope_type, "rope.type", CONFIG, f"{form}: rope_type {rope_type!r}"))
    else:
        add(unknown("rope.type", CONFIG, f"{form}: rope_type {rope_type!r} has no spec value"))
    if theta is not None:
        where = "rope_theta" + (f" in {form}" if form != "rope_theta" else "")
        add(known(float(theta), "rope.theta", CONFIG, where))
    extra = {k: v for k, v in source.items() if k not in ROPE_META_KEYS}
    evidence = f"{form}: scaling parameters {sorted(extra) or 'none'}"
    add(known(extra or None, "rope.parameters", CONFIG, evidence))
    add(known(form, "config.rope_form", CONFIG, "where RoPE is configured"))
    _partial_rotary_factor(raw, resolved, source, head_dim, add)


def _rope_source(raw: dict, resolved: Any) -> tuple[str | None, dict]:
    """(form, parameters): ``rope_parameters``, ``rope_scaling``, a bare
    ``rope_theta``, or the class default's ``rope_parameters``."""
    params = raw.get("rope_parameters")
    scaling = raw.get("rope_scaling")
    form = None
    if isinstance(params, dict):
        form = "rope_parameters"
        source = dict(params)
    elif isinstance(scaling, dict):
        form = "rope_scaling"
        source = dict(scaling)
    else:
        source = {}
        form = "rope_theta" if "rope_theta" in raw else None
    if form is None and resolved is not None and isinstance(_attr(resolved, "rope_parameters"), dict):
        source = dict(resolved.rope_parameters)
        form = f"{type(resolved).__name__}.rope_parameters default"
    return form, source


def _per_layer_type(form: str | None, source: dict, add) -> tuple[str | None, dict]:
    """Parameters keyed by attention layer type (Gemma 3): one set when they
    are all the same; otherwise a ``rope.layer_parameters`` finding and the
    one variant beside "default"."""
    per_type = {k: v for k, v in source.items() if isinstance(v, dict)}
    if not per_type or len(per_type) != len(source):
        return form, source
    distinct = {json.dumps(v, sort_keys=True) for v in per_type.values()}
    if len(distinct) == 1:
        return f"{form} (the same for every layer type)", dict(next(iter(per_type.values())))
    evidence = f"{form}: RoPE differs per layer type ({', '.join(sorted(per_type))})"
    add(known(per_type, "rope.layer_parameters", CONFIG, evidence))
    types = {v.get("rope_type", v.get("type")) or "default" for v in per_type.values()}
    # each layer type's rotary embedding picks its variant by its own rope_type at run time:
    # the model needs the one variant beside "default" (Gemma 3: linear on full-attention layers)
    variants = types - {"default"} if len(types) > 1 else types
    return form, {"rope_type": variants.pop()} if len(variants) == 1 else {"rope_type": "per layer type"}


def _partial_rotary_factor(raw: dict, resolved: Any, source: dict, head_dim: int | None, add) -> None:
    factor = source.get("partial_rotary_factor", raw.get("partial_rotary_factor"))
    where = "partial_rotary_factor"
    if factor is None and "rotary_pct" in raw:
        factor, where = raw["rotary_pct"], "rotary_pct"
    if factor is None and isinstance(raw.get("rotary_dim"), int) and head_dim:
        factor, where = raw["rotary_dim"] / head_dim, f"rotary_dim {raw['rotary_dim']} / head_dim {head_dim}"
    if factor is None and resolved is not None:
        rp = _attr(resolved, "rope_parameters")
        if isinstance(rp, dict) and "partial_rotary_factor" in rp:
            factor, where = (
                rp["partial_rotary_factor"],
                "rope_parameters.partial_rotary_factor (class default)",
            )
    if factor is not None:
        add(known(float(factor), "rope.partial_rotary_factor", CONFIG, where))


def _sliding(raw: dict, resolved: Any, layers: Any, add) -> None:
    def get(key: str) -> Any:
        if key in raw:
            return raw[key]
        return _attr(resolved, key) if resolved is not None else None

    window = get("sliding_window")
    use = get("use_sliding_window")
    types = get("layer_types")
    if isinstance(types, list) and types:
        add(known(tuple(types), "attention.layer_types", CONFIG, "layer_types"))
    if window is not None:
        add(
            known(
                window,
                "config.sliding_window",
                CONFIG,
                "sliding_window" + (f" (use_sliding_window={use})" if use is not None else ""),
            )
        )
    if use is not None:
        add(known(use, "config.use_sliding_window", CONFIG, "use_sliding_window"))
    if get("max_window_layers") is not None:
        add(known(get("max_window_layers"), "config.max_window_layers", CONFIG, "max_window_layers"))
