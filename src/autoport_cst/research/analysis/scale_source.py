"""The config field an attention scale comes from, and how: the field
itself (Granite's ``attention_multiplier``), its inverse square root
(Gemma's ``query_pre_attn_scalar ** -0.5``), a field of a nested sub-config
(MPT's ``attn_config.softmax_scale``), a field that is None and replaced by
``head_dim ** -0.5`` (the same MPT field unset), or a constant of the code;
for a kernel's ``scaling`` and for attention written out alike."""

from __future__ import annotations

import math
from typing import Any

from autoport_cst.research.analysis.graph import number
from autoport_cst.research.analysis.state import AnalyzerState
from autoport_cst.research.findings import CODE, known, unknown
from autoport_cst.research.interp.config_proxy import ConfigProxy
from autoport_cst.research.interp.values import UNKNOWN, Instance


def written_out(st: AnalyzerState, attn: Instance, where: str, hd: Any) -> None:
    """The config field the scale of attention written out comes from (MPT's
    ``attn_config.softmax_scale``), as for a kernel's ``scaling``: from the
    scale :func:`scores.analyze` found."""
    found = st.result.get("attention.scale")
    if found is None or not found.known or not isinstance(hd, int):
        return
    if found.value is None:
        default_scale(st, attn, hd**-0.5, where)
    elif number(found.value):
        from_scale(st, attn, float(found.value), where, hd)


def from_scale(st: AnalyzerState, attn: Instance, scaling: float, where: str, hd: int | None = None) -> None:
    """The config field a non-default attention scale comes from, and how:
    the field itself (Granite's attention_multiplier) or its inverse
    square root (Gemma's query_pre_attn_scalar ** -0.5); a constant of the
    code; or, named, a scale of ``1 / head_dim`` the code computes (Inkling,
    whose q/k norms make 1/d the scale), which no scale form describes."""
    candidates = _scale_candidates(st, attn, scaling)
    found = {(k, f) for k, f, _ in candidates}
    if len(found) == 1:
        key, form, evidence = candidates[0]
        st.add(known(key, "attention.scale_key", CODE, f"{where}: {evidence}"))
        st.add(known(form, "attention.scale_form", CODE, f"{where}: {evidence}"))
    elif not candidates and (constant := _constant_scale(attn, scaling)) is not None:
        # a constant of the code: no config field to read, the port writes the value (Gemma 4's 1.0)
        st.add(
            known(None, "attention.scale_key", CODE, f"{where}: self.{constant} = {scaling:g}, a constant")
        )
    else:
        seen = ", ".join(e for _, _, e in candidates) or "no config field gives it"
        st.add(unknown("attention.scale_key", CODE, f"{where}: scaling {scaling:g}: {seen}"))
        if not candidates and isinstance(hd, int) and hd > 0 and math.isclose(scaling, 1 / hd, rel_tol=1e-9):
            evidence = f"{where}: scaling = {scaling:g} = 1 / head_dim ({hd}), not head_dim ** -0.5"
            st.add(known(("attention.scale_key",), "unsupported.inverse_head_dim_scale", CODE, evidence))


def _constant_scale(attn: Instance, scaling: float) -> str | None:
    """The attention attribute equal to ``scaling`` that the code assigns a
    constant written in it (``self.scaling = 1.0``), or None: the scale is
    then the code's whatever the config says."""
    for attr, value in attn.attrs.items():
        if attr in attn.literal_attrs and number(value) and math.isclose(value, scaling, rel_tol=1e-9):
            return attr
    return None


def default_scale(st: AnalyzerState, attn: Instance, scaling: float, where: str) -> None:
    """A scale equal to ``head_dim ** -0.5`` in this config that the code
    computes from another config field (Gemma 2 with ``query_pre_attn_scalar
    == head_dim``): the field and form are recorded all the same, so that a
    port reads the field and stays right for configs where the two differ
    (Gemma-2-9B and 27B). The head size's own field is no other source."""
    candidates = [c for c in _scale_candidates(st, attn, scaling) if c[0] != "head_dim"]
    if candidates:
        suffix = "(equal to head_dim ** -0.5 in this config only)"
    else:
        candidates = _none_scale_candidates(st, attn, scaling)
        suffix = "(None here: head_dim ** -0.5)"
    if len({(k, f) for k, f, _ in candidates}) != 1:
        return
    key, form, evidence = candidates[0]
    evidence = f"{where}: {evidence} {suffix}"
    st.add(known(key, "attention.scale_key", CODE, evidence))
    st.add(known(form, "attention.scale_form", CODE, evidence))


def _scale_candidates(st: AnalyzerState, attn: Instance, scaling: float) -> list[tuple[str, str, str]]:
    """(config key, form, evidence) of every attention attribute equal to
    ``scaling`` that its assignment computed from one config field."""
    config = st.interp.config
    candidates = []
    for attr, value in attn.attrs.items():
        if not (number(value) and math.isclose(value, scaling, rel_tol=1e-9)):
            continue
        for key in config_keys_read(config, attn.attr_reads.get(attr, frozenset())):
            field_value = config_value(config, key)
            if not number(field_value) or field_value <= 0:
                continue
            if math.isclose(field_value, scaling, rel_tol=1e-9):
                candidates.append((key, "multiplier", f"self.{attr} = config.{key}"))
            elif math.isclose(field_value**-0.5, scaling, rel_tol=1e-9):
                candidates.append((key, "inverse_sqrt", f"self.{attr} = config.{key} ** -0.5"))
    return candidates


def _none_scale_candidates(st: AnalyzerState, attn: Instance, scaling: float) -> list[tuple[str, str, str]]:
    """(config key, form, evidence) of every attention attribute equal to
    the default ``scaling`` that first held a config field that is None and
    was then assigned the default (``self.softmax_scale =
    config.attn_config.softmax_scale``, then ``1 / sqrt(head_dim)`` when it is
    None): the field is the scale itself when set."""
    config = st.interp.config
    candidates = []
    for attr, value in attn.attrs.items():
        if attr not in attn.none_reads or not (number(value) and math.isclose(value, scaling, rel_tol=1e-9)):
            continue
        keys = [k for k in config_keys_read(config, attn.none_reads[attr]) if config_value(config, k) is None]
        if len(keys) == 1:
            candidates.append((keys[0], "multiplier", f"self.{attr} = config.{keys[0]}"))
    return candidates


def config_keys_read(config: Any, reads: frozenset[str]) -> list[str]:
    """The config keys among ``reads`` (the names an assignment read), a
    field of a nested sub-config dotted (``attn_config.softmax_scale`` for
    ``config.attn_config.softmax_scale``, which reads both names)."""
    keys = [key for key in sorted(reads) if config.has(key)]
    for outer in sorted(reads):
        inner = config_value(config, outer)
        if isinstance(inner, dict) or hasattr(inner, "to_dict"):
            keys += [f"{outer}.{key}" for key in sorted(reads) if key != outer and _holds_key(inner, key)]
    return [key for key in keys if not _nests(config, key)]


def config_value(config: Any, key: str) -> Any:
    """The value of config key ``key`` (dotted into a sub-config), unlogged;
    UNKNOWN when the config does not hold it."""
    head, _, rest = key.partition(".")
    if not config.has(head):
        return UNKNOWN
    value = config.read(head, None)
    if isinstance(value, ConfigProxy):
        value = value.wrapped  # a nested sub-config: its fields read unlogged
    for part in rest.split(".") if rest else ():
        if not _holds_key(value, part):
            return UNKNOWN
        value = value[part] if isinstance(value, dict) else getattr(value, part)
    return value


def _holds_key(value: Any, key: str) -> bool:
    if isinstance(value, dict):
        return key in value
    return hasattr(value, "to_dict") and hasattr(value, key)


def _nests(config: Any, key: str) -> bool:
    """``key`` holds a sub-config (a read on the way to its fields)."""
    value = config_value(config, key)
    return isinstance(value, dict) or hasattr(value, "to_dict")
