"""The attention section of the spec: head counts and head size (the
config's, unless the code builds others: a conflict), biases, q/k norms,
sliding window, sinks, softcap, the scale and the config field it comes
from, the attention kind and the features no field describes as flags; and
the note when the config sets a window the code does not apply."""

from __future__ import annotations

from typing import Any

from autoport_cst.research.decide.state import Decider
from autoport_cst.research.findings import CODE, CONFIG, known
from autoport_cst.spec import AttentionSpec
from autoport_cst.spec.model import ScaleForm


def head_dim(d: Decider) -> Any:
    """The head size: the code's when it computes one (a conflict when the
    config says otherwise), else the config's."""
    code_head_dim = d.code_finding("attention.head_dim")
    config_head_dim = d.cfg_finding("attention.head_dim")
    value = d.cfg.dims.get("head_dim")
    if code_head_dim is not None and code_head_dim.known:
        if value is not None and code_head_dim.value != value:
            d.conflict(
                "attention.head_dim",
                [
                    (CONFIG, value, config_head_dim.evidence if config_head_dim is not None else "head_dim"),
                    (CODE, code_head_dim.value, code_head_dim.evidence),
                ],
                f"the spec takes {code_head_dim.value}: the code computes the head size itself",
            )
        value = code_head_dim.value
    return value


def attention(d: Decider, head_size: Any) -> AttentionSpec:
    dims = d.cfg.dims
    sliding = d.decide("attention.sliding_window", "none", (CODE,))
    window_size = None
    if sliding != "none":
        window_size = d.decide("attention.sliding_window_size", None, (CODE,))
        if window_size is None:
            window_size = d.value("config.sliding_window")
    layer_types = d.value("attention.layer_types")
    heads = _count(d, "attention.num_heads", dims.get("num_heads"))
    kv_heads = _count(d, "attention.num_kv_heads", dims.get("num_kv_heads"))
    scale = d.decide("attention.scale", None, (CODE,))
    scale_key = None
    scale_form: ScaleForm = "multiplier"
    if scale is not None:
        scale_key = d.decide("attention.scale_key", None, (CODE,))
        if scale_key is not None:
            scale_form = d.decide("attention.scale_form", "multiplier", (CODE,))
    else:
        # the default scale, computed from a config field that equals the
        # head size here only (Gemma 2's query_pre_attn_scalar): read it
        scale_key = d.flag("attention.scale_key", None)
        if scale_key is not None:
            scale_form = d.flag("attention.scale_form", "multiplier")
    return AttentionSpec(
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_size,
        qkv_bias=d.decide("attention.qkv_bias", False, (CODE,)),
        o_bias=d.decide("attention.o_bias", False, (CODE,)),
        qk_norm=d.decide("attention.qk_norm", "none", (CODE,)),
        qk_norm_position=d.flag("attention.qk_norm_position", "before_rope"),
        qk_norm_affine=d.flag("attention.qk_norm_affine", True),
        qk_norm_layers=d.flag("attention.qk_norm_layers", "all"),
        sliding_window=sliding,
        sliding_window_size=window_size,
        layer_types=tuple(layer_types) if layer_types else None,
        layer_types_key=d.flag("attention.layer_types_key", "layer_types"),
        sliding_layer_type=d.flag("attention.sliding_layer_type", "sliding_attention"),
        chunked=d.flag("attention.chunked", "none"),
        chunk_size=d.flag("attention.chunk_size", None),
        sinks=d.decide("attention.sinks", False, (CODE,)),
        softcap=d.decide("attention.softcap", None, (CODE,)),
        scale=scale,
        scale_key=scale_key,
        scale_form=scale_form,
        kind=d.flag("attention.kind", "softmax"),
        output_norm=d.flag("attention.output_norm", False),
        output_gate=d.flag("attention.output_gate", "none"),
        other_mixer_layers=d.flag("attention.other_mixer_layers", None),
        multi_query_key=multi_query_key(d),
        **_temperature(d),
        **_latent(d),
        alibi_bias_max=d.flag("attention.alibi_bias_max", None),
        alibi_scaled=d.flag("attention.alibi_scaled", False),
    )


def multi_query_key(d: Decider) -> str | None:
    """The boolean config field, set, that makes the code build one key/value
    head whatever the config's count (gpt_bigcode's ``multi_query``)."""
    code = d.code_finding("attention.num_kv_heads")
    if code is None or not code.known or code.value != 1:
        return None
    flags = [k for k, v in d.cfg.raw.items() if v is True and "multi_query" in k]
    return flags[0] if len(flags) == 1 else None


def _temperature(d: Decider) -> dict[str, Any]:
    """The attention temperature as the code computes it (absent: none)."""
    defaults = {"beta_key": None, "floor_key": None, "offset": 0.0, "layers": "all", "rounded": False}
    return {f"temperature_{k}": d.flag(f"attention.temperature_{k}", v) for k, v in defaults.items()}


def _latent(d: Decider) -> dict[str, Any]:
    """Multi-latent attention's query LoRA and sizes, as the code builds them
    (absent for other attention)."""
    fields = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
    found: dict[str, Any] = {name: d.flag(f"attention.{name}", None) for name in fields}
    found["q_lora"] = d.flag("attention.q_lora", False)
    return found


def window_check(d: Decider) -> None:
    """A note when config.json sets a sliding window the code never applies."""
    window = d.cfg_finding("config.sliding_window")
    sliding = d.code_finding("attention.sliding_window")
    if (
        window is not None
        and window.known
        and window.value
        and sliding is not None
        and sliding.known
        and sliding.value == "none"
    ):
        d.notes.append(
            known(
                window.value,
                "config.sliding_window_unused",
                CONFIG,
                f"config sets sliding_window={window.value} but the code applies no window "
                f"({window.evidence})",
            )
        )


def _count(d: Decider, name: str, config_value: Any) -> Any:
    """A head count: the config's, unless the code builds another."""
    code = d.code_finding(name)
    cfg = d.cfg_finding(name)
    if code is not None and code.known:
        if config_value is not None and code.value != config_value:
            d.conflict(
                name,
                [(CONFIG, config_value, cfg.evidence if cfg else ""), (CODE, code.value, code.evidence)],
                f"the spec takes {code.value}: the projections the code builds",
            )
        d.decisions.append(code)
        return code.value
    if cfg is not None:
        d.decisions.append(cfg)
    return config_value
