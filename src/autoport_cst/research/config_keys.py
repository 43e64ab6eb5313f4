"""Where a port finds the config fields it reads (``checkpoint.config_keys``)
when the model's config.json writes them under other names.

A port reads the Llama family's names (``hidden_size``, ``num_attention_heads``,
...). GPT-J, CodeGen and the GPT-2 lineage write ``n_embd``, ``n_head``,
``n_layer``, ``n_positions``: transformers reads them through the config
class's ``attribute_map``, and so must the port. A feed-forward width the
config leaves unset (GPT-J's ``n_inner = None``) that the code builds as a
multiple of the hidden size (``4 * n_embd``) is read as that multiple, and
a rotary dimension given in channels (``rotary_dim``) as the fraction of the
head a port reads (``partial_rotary_factor``). A constant the code computes
from several config fields (MiniCPM3's residual multiplier ``scale_depth /
num_hidden_layers ** 0.5``; the code analysis finds it) is computed the same
way when config.json holds every field it reads."""

from __future__ import annotations

from typing import Any

from autoport_cst.research.analysis.config_expressions import fields_of
from autoport_cst.research.config_analysis import INTERMEDIATE_KEYS, KV_KEYS
from autoport_cst.research.decide.state import Decider
from autoport_cst.research.findings import CONFIG, known, unknown

# the config fields a port reads, under the names the references use
PORT_FIELDS = (
    "hidden_size",
    "num_attention_heads",
    "num_hidden_layers",
    "max_position_embeddings",
    "vocab_size",
    "num_key_value_heads",
)


def config_keys(d: Decider) -> dict[str, str] | None:
    """Port field -> where config.json holds it, for the fields it does not
    hold under the port's name; None when it holds them all."""
    raw, resolved = d.cfg.raw, d.cfg.resolved
    aliases: dict[str, Any] = dict(getattr(type(resolved), "attribute_map", None) or {})
    keys = {
        name: aliases[name]
        for name in PORT_FIELDS
        if name not in raw and isinstance(aliases.get(name), str) and aliases[name] in raw
    }
    kv = _kv_heads_key(d, raw)
    if "num_key_value_heads" not in keys and kv is not None:
        keys["num_key_value_heads"] = kv
    built = d.code_finding("mlp.intermediate_size")
    width = _intermediate_key(
        raw,
        keys.get("hidden_size", "hidden_size"),
        built.value if built is not None and built.known else None,
    )
    if width is not None:
        keys["intermediate_size"] = width
    rotary = _rotary_fraction(raw, keys.get("hidden_size", "hidden_size"), keys.get("num_attention_heads"))
    if rotary is not None:
        keys["partial_rotary_factor"] = rotary
    keys.update(_computed_fields(d, raw))
    if not keys:
        return None
    shown = ", ".join(f"{name} <- {key}" for name, key in sorted(keys.items()))
    d.decisions.append(
        known(keys, "checkpoint.config_keys", CONFIG, f"config.json names the fields a port reads: {shown}")
    )
    return keys


def _kv_heads_key(d: Decider, raw: dict[str, Any]) -> str | None:
    """The config field holding the KV head count under another name
    (Falcon's ``num_kv_heads``), when config.json lacks
    ``num_key_value_heads`` and that field holds as many KV heads as the
    code's projections build (not Falcon-7B's: multi-query builds one KV head
    whatever ``num_kv_heads`` says)."""
    built = d.code_finding("attention.num_kv_heads")
    if raw.get("num_key_value_heads") is not None or built is None or not built.known:
        return None
    found = [k for k in KV_KEYS[1:] if raw.get(k) is not None]
    return found[0] if len(found) == 1 and raw[found[0]] == built.value else None


def _intermediate_key(raw: dict[str, Any], hidden_key: str, built: int | None) -> str | None:
    """The MLP width under another key, and the multiple of the hidden size
    the code builds when the config leaves it unset."""
    if raw.get("intermediate_size") is not None:
        return None
    key = next((k for k in INTERMEDIATE_KEYS[1:] if k in raw), None)
    if key is not None and raw[key] is not None:
        return key
    hidden = raw.get(hidden_key)
    if not isinstance(built, int) or not isinstance(hidden, int) or not hidden or built % hidden:
        return None
    multiple = f"{built // hidden} * {hidden_key}"
    return f"{key} or {multiple}" if key is not None else multiple


def _rotary_fraction(raw: dict[str, Any], hidden_key: str, heads_key: str | None) -> str | None:
    """The rotated fraction of a head for a config giving it in channels
    (``rotary_dim``: GPT-J, CodeGen) rather than as a fraction."""
    rope = raw.get("rope_parameters")
    given = "partial_rotary_factor" in raw or (isinstance(rope, dict) and "partial_rotary_factor" in rope)
    if not isinstance(raw.get("rotary_dim"), int) or given:
        return None
    if raw.get("head_dim") is not None:
        return "rotary_dim / head_dim"
    return f"rotary_dim / ({hidden_key} // {heads_key or 'num_attention_heads'})"


def _computed_fields(d: Decider, raw: dict[str, Any]) -> dict[str, str]:
    """The port fields the code analysis found computed from config fields,
    each kept when config.json holds every field its expression reads (else
    reported unknown: the port would read its field's default)."""
    found = d.code_finding("checkpoint.config_keys")
    if found is None or not found.known or not found.value:
        return {}
    d.decisions.append(found)
    kept = {}
    for name, text in found.value.items():
        missing = [k for k in fields_of(text) if raw.get(k) is None]
        if not missing:
            kept[name] = text
            continue
        evidence = (
            f"{name} = {text}: config.json has no {', '.join(missing)} (the port reads its own default)"
        )
        d.decisions.append(unknown("checkpoint.config_keys", CONFIG, evidence))
        d.unknown.append("checkpoint.config_keys")
    return kept
