"""Where the sliding window of attention written out comes from in the
config, when a port would not find it there.

A port reads the window from ``config.sliding_window`` and, when only some
layers slide, which ones from ``config.layer_types`` (``"sliding_attention"``).
A model whose attention computes its own mask (GPT-Neo's ``bias`` buffer:
``tril(ones) ^ tril(ones, -config.window_size)`` on the layers
``config.attention_layers`` marks ``"local"``) may take both from other
fields: a port reading its own would apply no window at all. The fields are
found by what the code computes: each layer's attention is built again with
one config field changed (an integer equal to the window: the window must
follow it; a per-layer list: the layers must swap), and the window read
again (:mod:`band_mask`). The port then reads them there (sliding-window's
``layer_types_key``, config-key-aliases); a model whose fields are not
found is refused naming what is not, not ported without its window."""

from __future__ import annotations

from typing import Any

from autoport_cst.research.analysis import band_mask
from autoport_cst.research.analysis.config_expressions import add_config_key
from autoport_cst.research.analysis.state import AnalyzerState
from autoport_cst.research.findings import CODE, known
from autoport_cst.research.interp.config_proxy import ConfigProxy
from autoport_cst.research.interp.values import Instance, Node

SLIDING_TYPE = "sliding_attention"  # what a port reads in config.layer_types


def check(st: AnalyzerState, windows: list[Any], where: str) -> None:
    """Where a port finds the window and the sliding layers: under the
    fields it reads, or, found by what the code computes, under others
    (the window's field read as ``sliding_window``: ``checkpoint.config_keys``;
    the per-layer list and its sliding entry: ``attention.layer_types_key``
    and ``attention.sliding_layer_type``); refused
    (``unsupported.window_fields``) naming what is not found."""
    sizes = {w for w in windows if isinstance(w, int) and w > 0}
    if len(sizes) != 1 or len(windows) != len(st.layers):
        return
    size = sizes.pop()
    sliding = [w is not None and w > 0 for w in windows]
    config = st.interp.config
    types = config.read("layer_types", None)
    marked = all(sliding) or (
        isinstance(types, (list, tuple))
        and len(types) == len(sliding)
        and all((t == SLIDING_TYPE) == s for t, s in zip(types, sliding, strict=True))
    )
    window_key = "sliding_window" if config.read("sliding_window", None) == size else _window_field(st, size)
    layers = None if marked else _layers_field(st, sliding)
    if window_key is not None and (marked or layers is not None):
        if window_key != "sliding_window":
            add_config_key(
                st, "sliding_window", window_key, f"{where}: the window follows config.{window_key}"
            )
        if layers is not None:
            key, entry = layers
            evidence = f"{where}: the layers config.{key} marks {entry!r} slide (the others do not)"
            st.add(known(key, "attention.layer_types_key", CODE, evidence))
            st.add(known(entry, "attention.sliding_layer_type", CODE, evidence))
        return
    said = [f"the window ({size} tokens) comes from {_named(window_key) or 'no config field found'}"]
    if not marked:
        found = f"config.{layers[0]} ({layers[1]!r} on the sliding layers)" if layers else None
        said.append(f"the layers that slide from {found or 'no config field found'}")
    evidence = (
        f"{where}: {'; '.join(said)}; a port reads config.sliding_window and config.layer_types "
        f"({SLIDING_TYPE!r}), which this config does not set so"
    )
    st.add(known(("attention.sliding_window",), "unsupported.window_fields", CODE, evidence))


def _named(key: str | None) -> str | None:
    return f"config.{key}" if key else None


def _window_field(st: AnalyzerState, size: int) -> str | None:
    """The integer field equal to the window that the window follows when
    changed (on a sliding layer)."""
    index = next((i for i, _ in enumerate(st.layers) if _layer_window(st, i, {}) == size), None)
    if index is None:
        return None
    for key, value in _fields(st):
        if value == size and not isinstance(value, bool):
            if _layer_window(st, index, {key: size + 1}) == size + 1:
                return key
    return None


def _layers_field(st: AnalyzerState, sliding: list[bool]) -> tuple[str, Any] | None:
    """The per-layer list whose change (the entries of a sliding and a full
    layer swapped) swaps which layers slide, and its one entry on the
    sliding layers (None when they differ, or a full layer has it too)."""
    first_on, first_off = sliding.index(True), sliding.index(False)
    for key, value in _fields(st):
        if not isinstance(value, (list, tuple)) or len(value) != len(sliding):
            continue
        swapped = list(value)
        swapped[first_on], swapped[first_off] = value[first_off], value[first_on]
        if swapped == list(value):
            continue
        on = _layer_window(st, first_on, {key: swapped}) is None
        off = _layer_window(st, first_off, {key: swapped}) is not None
        entries = {value[i] for i, s in enumerate(sliding) if s}
        others = {value[i] for i, s in enumerate(sliding) if not s}
        if on and off and len(entries) == 1 and not entries & others:
            return key, entries.pop()
    return None


def _fields(st: AnalyzerState) -> list[tuple[str, Any]]:
    raw = st.interp.config.wrapped
    names = raw.to_dict() if hasattr(raw, "to_dict") else dict(raw) if isinstance(raw, dict) else {}
    return [(k, v) for k, v in names.items() if isinstance(v, (int, list, tuple))]


def _layer_window(st: AnalyzerState, index: int, overrides: dict[str, Any]) -> Any:
    """The window of layer ``index`` built again with ``overrides`` (the
    layer itself when there are none): its attention's mask buffer read."""
    layer = st.layers[index]
    if overrides:
        config = st.interp.config.copy()
        config.overrides = {**(config.overrides or {}), **overrides}
        kwargs = {k: config if isinstance(v, ConfigProxy) else v for k, v in layer.args.items()}
        try:
            layer = st.interp.instantiate(layer.cls, [], kwargs, {})
        except Exception:  # noqa: BLE001 - a config the code refuses: not this field
            return "unread"
    attn = _attention(st, layer)
    if attn is None:
        return "unread"
    reads = [band_mask.band(v) for v in attn.attrs.values() if isinstance(v, Node)]
    bands = [b for b in reads if b is not None and b.hi == 0]
    if len(bands) != 1:
        return "unread"
    lo = bands[0].lo
    return None if lo == float("-inf") else 1 - int(lo)


def _attention(st: AnalyzerState, layer: Any) -> Instance | None:
    """The layer's attention: at its weights' path (a layer built again
    keeps GPT-Neo's pass-through wrapper, ``attn.attention``), else its
    attention child (the analysed layers, the wrapper spliced out)."""
    for path in dict.fromkeys((st.attn_path, st.attn_name)):
        found = layer
        for name in path.split(".") if path else ():
            found = dict(found.children()).get(name) if isinstance(found, Instance) else None
        if isinstance(found, Instance) and found is not layer:
            return found
    return None
