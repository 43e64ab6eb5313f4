"""Which config fields the computation depends on, field by field.

A port is registered for an architecture (every ``Gemma2ForCausalLM``), but
it is planned on one config. What the research decides about the computation
can hold for that config only: the tiny Gemma 2 config has
``query_pre_attn_scalar == head_dim``, so its attention scale equals
``head_dim ** -0.5``, which Gemma-2-9B's does not.

So the research is run again with one config field varied at a time, on
every field the modeling code read while the model was constructed and run
(``CodeAnalysis.config_reads``), and the specs are compared: a
:class:`FieldProbe` per field lists the spec fields that changed (or that
the varied config leaves unclassified). Whether a port handles such a change
at run time (a size, an epsilon, a RoPE base it reads from the config) or
bakes the planned value in (a feature its code realizes once) is decided
against the port's reference in :mod:`autoport_cst.plan.assumptions`.

The varied value of a field: a boolean flipped, a number doubled (0 becomes
1 or 0.5), a string replaced by one no code knows, ``None`` replaced by a
value of the type the config class annotates (4, 0.5 or True), and numbers
and booleans inside a dict field (``rope_parameters.rope_theta``) one by one,
with the None entries of the config of a part of the model (MPT's
``attn_config``, no model_type of its own) by their class's annotation.
Lists (per-layer settings), strings inside dicts (the RoPE type, which every
reference reads and refuses at run time when it does not implement it) and
private fields (``_attn_implementation``) are not varied; they are listed
as skipped with the reason.

A model with many layers is probed on a copy with fewer (per-layer lists
cut to match: 4, else 8 or 16) when that copy gives the same features as the
full config: the cost of a probe grows with the layers the interpreter
constructs.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from typing import Any

from autoport_cst.research.config_analysis import LAYER_KEYS, analyze_config, resolve_config
from autoport_cst.spec import ArchSpec, diff_specs

# a model with more layers is probed on a copy with the first of these
# layer counts that keeps its features
PROBE_LAYERS = (4, 8, 16)
# the sentinel of "this field cannot be varied"
_SAME = object()


@dataclass(frozen=True)
class SpecChange:
    """One spec field the varied config changes."""

    path: str
    role: str
    planned: Any
    varied: Any


@dataclass(frozen=True)
class FieldProbe:
    """The research of the config with ``field`` set to ``varied``. ``field``
    is dotted for an entry of a dict field (``rope_parameters.rope_theta``)."""

    field: str
    value: Any
    varied: Any
    default: Any = None  # the value transformers takes when a config lacks the field
    changes: tuple[SpecChange, ...] = ()
    unknown: tuple[str, ...] = ()  # computation fields the varied config leaves unclassified
    error: str | None = None  # why the varied config could not be researched
    # (field, value, varied) of a field varied first: the code reads ``field``
    # only under that variation (a second-order probe)
    given: tuple[tuple[str, Any, Any], ...] = ()
    # a field varied to the same value with this one: alone, either leaves the
    # model unsupported (Falcon without multi-query needs num_kv_heads equal to
    # num_attention_heads), together they do not (a relation, not a value)
    together: str | None = None

    @property
    def changes_computation(self) -> bool:
        return bool(self.changes or self.unknown)


@dataclass(frozen=True)
class ConfigDependence:
    """Every config field the modeling code reads, and what varying each changes."""

    reads: tuple[str, ...]
    probes: tuple[FieldProbe, ...]
    skipped: tuple[tuple[str, str], ...] = ()  # (field, why it was not varied)
    layers: int | None = None  # the layer count the probes ran with (None: the config's)
    # (per-layer field, field, its entries): a list whose entries the code uses in
    # place of the field's value (GraniteSWA's layer_rope_theta for rope_theta)
    per_layer: tuple[tuple[str, str, tuple[Any, ...]], ...] = ()
    # (field, value) of a field the model's own construction sets where the
    # config holds None (Falcon's decoder layers: num_ln_in_parallel_attn 2)
    written: tuple[tuple[str, Any], ...] = ()

    def probe(self, field: str) -> FieldProbe | None:
        return next((p for p in self.probes if p.field == field), None)


def probe_config(
    raw: dict[str, Any],
    resolved: Any,
    path: str,
    modeling: Any,
    architecture: str,
    reads: tuple[str, ...],
) -> ConfigDependence:
    """Vary each field of ``reads`` in ``raw`` (the config.json values;
    ``resolved`` is the transformers config with the class defaults) and
    research the model again without a checkpoint."""
    defaults = _class_defaults(resolved)
    raw, resolved, layers = _fewer_layers(raw, resolved, path, modeling, architecture)
    run = _Runner(path, modeling, architecture, _layer_types_mentioned(modeling), derived_keys(raw, path))
    baseline = run.research(raw, resolved)
    probes: list[FieldProbe] = []
    skipped: list[tuple[str, str]] = []
    for name in reads:
        for field_name, value, varied, why in _variations(name, raw, resolved, run.layer_types):
            if varied is _SAME:
                skipped.append((field_name, why))
                continue
            probe, outcome = run.probe(field_name, value, varied, raw, baseline)
            default = _dotted(field_name, defaults) if defaults is not None else value
            probes.append(dataclasses.replace(probe, default=value if default is _SAME else default))
            if outcome is not None:
                probes += _second_order(run, probe, outcome, raw, baseline, skipped)
    probes += _related(run, probes, raw, baseline)
    written = model_writes(resolved, architecture, probes)
    return ConfigDependence(
        tuple(reads), tuple(probes), tuple(skipped), layers, _per_layer(baseline, raw), written
    )


def model_writes(resolved: Any, architecture: str, probes: list[FieldProbe]) -> tuple[tuple[str, Any], ...]:
    """(field, value) of each top-level config field that holds None in
    ``resolved`` and that the transformers model's own construction sets
    (Falcon's decoder layers write ``num_ln_in_parallel_attn = 2`` on the
    config object when the new decoder architecture leaves it None): the
    model computes with that value, and ``save_pretrained`` of a loaded model
    writes it. Only the fields whose probe of None changed the computation
    are looked at (the others get no guard), on the meta device; none when
    the model cannot be built."""
    names = [
        p.field
        for p in probes
        if p.value is None and "." not in p.field and not p.given and p.changes_computation
    ]
    if not names or resolved is None:
        return ()
    try:
        import torch
        import transformers

        config = copy.deepcopy(resolved)
        with torch.device("meta"):
            model = getattr(transformers, architecture)(config)
    except Exception:  # noqa: BLE001 - no model to read writes from: nothing is taken as written
        return ()
    built = getattr(model, "config", config)
    found = {name: getattr(built, name, None) for name in dict.fromkeys(names)}
    return tuple((name, value) for name, value in found.items() if _scalar(value))


def _scalar(value: Any) -> bool:
    """A JSON scalar other than null (what a guard can accept as written)."""
    return isinstance(value, (bool, int, float, str))


def _per_layer(baseline: _Outcome, raw: dict) -> tuple[tuple[str, str, tuple[Any, ...]], ...]:
    """The per-layer RoPE base list the code rotates with (research's
    ``code.rope_base_field``) with the config field a port reads the base
    from: ``rope_parameters.rope_theta``, or a top-level ``rope_theta``."""
    if baseline.base_field is None:
        return ()
    rope = raw.get("rope_parameters")
    theta = "rope_parameters.rope_theta" if isinstance(rope, dict) and "rope_theta" in rope else "rope_theta"
    entries = _current(baseline.base_field, raw, baseline.resolved)
    return ((baseline.base_field, theta, tuple(entries)),) if isinstance(entries, (list, tuple)) else ()


def _second_order(
    run: _Runner, first: FieldProbe, outcome: _Outcome, raw: dict, baseline: _Outcome, skipped: list
) -> list[FieldProbe]:
    """Fields the code reads only under ``first``'s value (a window read for
    sliding layers only), varied on top of it: the probe names ``first`` as
    given, and a port that bakes its result in is guarded on ``first``'s
    field."""
    base = with_field(raw, first.field, first.varied)
    resolved = outcome.resolved
    probes = []
    for name in sorted(outcome.reads - baseline.reads):
        for field_name, value, varied, why in _variations(name, base, resolved, run.layer_types):
            if varied is _SAME:
                skipped.append((f"{field_name} (with {first.field} = {first.varied!r})", why))
                continue
            probe, _ = run.probe(field_name, value, varied, base, baseline)
            given = ((first.field, first.value, first.varied),)
            probes.append(dataclasses.replace(probe, default=value, given=given))
    return probes


def derived_keys(raw: dict, path: str) -> tuple[str, ...]:
    """The keys of config.json that its config class does not declare as
    fields but derives at init from the others, to the value config.json
    holds (transformers 5.25's FalconConfig writes ``num_key_value_heads``,
    ``num_kv_heads`` or 1 with multi-query): a config varied in another
    field has them derived again, as transformers would write it (it keeps
    a value config.json gives, so a stale one would stay)."""
    try:
        resolved = resolve_config(raw, path)
        cls = type(resolved)
        if resolved is None or not dataclasses.is_dataclass(cls):
            return ()
        declared = {f.name for f in dataclasses.fields(cls)}
        loose = [k for k in raw if k not in declared and k in vars(resolved) and not k.startswith("_")]
        fresh = resolve_config({k: v for k, v in raw.items() if k not in loose}, path)
    except Exception:  # noqa: BLE001 - a config the class refuses without them: none derived
        return ()
    return tuple(k for k in loose if k in vars(fresh) and getattr(fresh, k) == raw[k])


def rederive(raw: dict, keys: tuple[str, ...], path: str) -> dict:
    """``raw`` with ``keys`` (:func:`derived_keys`) as its config class
    derives them from the other fields."""
    if not keys:
        return raw
    fresh = resolve_config({k: v for k, v in raw.items() if k not in keys}, path)
    return {**raw, **{k: getattr(fresh, k) for k in keys if hasattr(fresh, k)}}


def _unsupported(probe: FieldProbe) -> bool:
    return probe.error is None and (
        "unsupported" in probe.unknown or any(c.path == "unsupported" for c in probe.changes)
    )


def _related(run: _Runner, probes: list[FieldProbe], raw: dict, baseline: _Outcome) -> list[FieldProbe]:
    """Fields equal in the config whose variation alone leaves the model
    unsupported, varied together (to the same value): a probe of the later
    field ``together`` with the earlier when that is supported. A port is
    then guarded on the relation (the two equal), not on either value."""
    broken = [p for p in probes if not p.given and _unsupported(p)]
    related = []
    for index, probe in enumerate(broken):
        for other in broken[:index]:
            if (other.value, other.varied) != (probe.value, probe.varied) or isinstance(probe.value, bool):
                continue
            base = with_field(raw, other.field, other.varied)
            joint, _ = run.probe(probe.field, probe.value, probe.varied, base, baseline)
            if joint.error is None and not _unsupported(joint):
                related.append(dataclasses.replace(joint, default=probe.default, together=other.field))
                break
    return related


def _class_defaults(resolved: Any) -> dict | None:
    """The values of a config that sets nothing (the class defaults)."""
    try:
        return type(resolved)().to_dict() if resolved is not None else None
    except Exception:  # noqa: BLE001 - a config class that needs arguments
        return None


def _dotted(name: str, values: dict) -> Any:
    value: Any = values
    for part in name.split("."):
        if not isinstance(value, dict) or part not in value:
            return _SAME
        value = value[part]
    return value


def varied_value(value: Any, annotation: Any = None) -> Any:
    """The value a field is varied to (``_SAME``-like None when it is not:
    see :func:`can_vary`)."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value * 2 if value else 1
    if isinstance(value, float):
        return value * 2 if value else 0.5
    if isinstance(value, str):
        return f"{value}_varied"
    if value is None:
        return _none_varied(annotation)
    return _SAME


def can_vary(value: Any, annotation: Any = None) -> bool:
    return varied_value(value, annotation) is not _SAME


def _none_varied(annotation: Any) -> Any:
    """A value of the annotated type for a field that is None."""
    text = str(annotation or "")
    kinds = [k.strip() for k in text.replace("typing.", "").split("|")]
    for kind, value in (("bool", True), ("int", 4), ("float", 0.5)):
        if kind in kinds or f"<class '{kind}'>" in kinds:
            return value
    return _SAME


def _variations(name: str, raw: dict, resolved: Any, layer_types: tuple[str, ...]):
    """(field, value, varied, why not) for a field the code read, for each
    number or boolean of a dict field, and for a list of per-layer types each
    type the modeling code names that the list lacks (in the last layer)."""
    if name.startswith("_"):
        yield name, None, _SAME, "private setting of transformers, not of the model"
        return
    value = _current(name, raw, resolved)
    if isinstance(value, dict):
        yield from _dict_variations(name, value, _part_config(resolved, name))
        return
    if isinstance(value, (list, tuple)):
        others = [t for t in layer_types if t not in value] if _per_layer_types(value) else []
        for other in others:
            yield name, list(value), [*value[:-1], other], ""
        if not others:
            yield name, value, _SAME, "a list that is not of per-layer types the code names"
        return
    annotation = _annotation(resolved, name)
    varied = varied_value(value, annotation)
    why = "" if varied is not _SAME else f"no other value of {type(value).__name__} to try"
    if varied is not _SAME and _derived(name, varied, raw):
        varied, why = _SAME, "the config class sets it from other fields (config.json cannot vary it)"
    yield name, value, varied, why


def _derived(name: str, varied: Any, raw: dict) -> bool:
    """Whether transformers' config class replaces ``varied`` given for
    ``name`` (DeepSeek-V2 sets ``head_dim`` to ``qk_rope_head_dim`` whatever
    config.json says): no config can carry the variation."""
    if "model_type" not in raw:
        return False
    try:
        built = resolve_config({**raw, name: varied}, "<varied config>")
    except Exception:  # noqa: BLE001 - a class refusing the value is not a class replacing it
        return False
    return built is not None and hasattr(built, name) and getattr(built, name) != varied


def _per_layer_types(value: Any) -> bool:
    return bool(value) and all(isinstance(v, str) for v in value)


def _layer_types_mentioned(modeling: Any) -> tuple[str, ...]:
    """The per-layer types of transformers (``sliding_attention``, ``dense``...)
    that the modeling source names: the ones its code can tell apart."""
    try:
        from transformers.configuration_utils import ALLOWED_LAYER_TYPES

        text = modeling.path.read_text(encoding="utf-8")
    except (ImportError, OSError, AttributeError):
        return ()
    return tuple(t for t in ALLOWED_LAYER_TYPES if f'"{t}"' in text or f"'{t}'" in text)


def _part_config(resolved: Any, name: str) -> Any:
    """The config object of dict field ``name`` when it configures a part of
    this model (MPT's ``attn_config``: no model_type of its own), else None;
    a whole sub-model's config (a vision-language model's ``text_config``)
    is not one."""
    part = getattr(resolved, name, None) if resolved is not None else None
    return part if hasattr(part, "to_dict") and not getattr(part, "model_type", None) else None


def _dict_variations(name: str, value: dict, part: Any = None, depth: int = 0):
    """Each number and boolean of a dict field, and each None entry of a
    part's config that its class annotates as a number or a boolean (MPT's
    ``attn_config.clip_qkv`` and ``softmax_scale``: a port planned where
    they are None must read or refuse another value)."""
    for key in sorted(value, key=str):
        inner = value[key]
        dotted = f"{name}.{key}"
        if isinstance(inner, dict) and depth == 0:
            yield from _dict_variations(dotted, inner, None, depth + 1)
        elif isinstance(inner, (bool, int, float)):
            yield dotted, inner, varied_value(inner), ""
        elif isinstance(inner, str):
            yield dotted, inner, _SAME, "a setting named inside a dict (the port reads and checks it)"
        elif inner is None and part is not None and not str(key).startswith("_"):
            varied = _none_varied(_annotation(part, str(key)))
            if varied is not _SAME:
                yield dotted, None, varied, ""


def _current(name: str, raw: dict, resolved: Any) -> Any:
    if name in raw:
        return raw[name]
    if resolved is not None:
        value = getattr(resolved, name, None)
        if hasattr(value, "to_dict") and not isinstance(value, dict):
            return None
        return value
    return None


def _annotation(resolved: Any, name: str) -> Any:
    for klass in type(resolved).__mro__ if resolved is not None else ():
        annotation = getattr(klass, "__annotations__", {}).get(name)
        if annotation is not None:
            return annotation
    return None


def with_field(raw: dict, name: str, value: Any) -> dict:
    """A copy of ``raw`` with field ``name`` (dotted into dicts) set. A new
    layer count carries the per-layer lists along (their pattern repeated,
    or cut), so that the config stays one transformers accepts."""
    out = copy.deepcopy(raw)
    parts = name.split(".")
    target = out
    for part in parts[:-1]:
        inner = target.get(part)
        target[part] = dict(inner) if isinstance(inner, dict) else {}
        target = target[part]
    old = target.get(parts[-1])
    target[parts[-1]] = value
    if name in LAYER_KEYS and isinstance(old, int) and isinstance(value, int) and old > 0:
        for key, items in out.items():
            if isinstance(items, list) and len(items) == old and items:
                out[key] = [items[i % old] for i in range(value)]
    return out


@dataclass(frozen=True)
class _Outcome:
    spec: ArchSpec
    unknown: frozenset[str]
    reads: frozenset[str]
    resolved: Any
    base_field: str | None = None  # the per-layer RoPE base list (code.rope_base_field)


def _research(raw: dict, resolved: Any, path: str, modeling: Any, architecture: str) -> _Outcome:
    from autoport_cst.research.code_analysis import analyze_code
    from autoport_cst.research.crosscheck import decide_spec

    cfg = analyze_config(raw, resolved, path)
    code = analyze_code(modeling, resolved if resolved is not None else raw, architecture, cfg.dims)
    decision = decide_spec(cfg, code, None, [])
    base = code.get("code.rope_base_field")
    base_field = base.value if base is not None and base.known else None
    return _Outcome(
        decision.spec, frozenset(decision.unknown), frozenset(code.config_reads), resolved, base_field
    )


@dataclass(frozen=True)
class _Runner:
    """The research of one model, repeated on varied configs."""

    path: str
    modeling: Any
    architecture: str
    layer_types: tuple[str, ...]  # the per-layer types the modeling code names
    # config.json keys the config class derives from the others (derived_keys)
    derived: tuple[str, ...] = ()

    def research(self, raw: dict, resolved: Any) -> _Outcome:
        return _research(raw, resolved, self.path, self.modeling, self.architecture)

    def probe(
        self, name: str, value: Any, varied: Any, raw: dict, baseline: _Outcome
    ) -> tuple[FieldProbe, _Outcome | None]:
        """``raw`` with ``name`` set to ``varied``, researched and compared
        with ``baseline``."""
        changed = with_field(raw, name, varied)
        try:
            changed = rederive(changed, self.derived, self.path)
            outcome = self.research(changed, resolve_config(changed, self.path))
        except Exception as error:  # noqa: BLE001 - the config class or the analysis refuses the value
            first = str(error).strip().splitlines()[0] if str(error).strip() else ""
            return FieldProbe(name, value, varied, error=f"{type(error).__name__}: {first}"[:200]), None
        changes = tuple(
            SpecChange(d.path, d.role, d.reference, d.target) for d in diff_specs(baseline.spec, outcome.spec)
        )
        unknown = tuple(sorted(outcome.unknown - baseline.unknown))
        return FieldProbe(name, value, varied, changes=changes, unknown=unknown), outcome


def _read_properties(config: Any) -> None:
    """Read every property of the config class: one that the cut refuses
    raises (Gemma 3n's ``kv_sharing_modes`` with more KV-sharing layers than
    layers), and the full config is probed instead."""
    for klass in type(config).__mro__ if config is not None else ():
        for name, attribute in vars(klass).items():
            if isinstance(attribute, property):
                getattr(config, name)


def _fewer_layers(
    raw: dict, resolved: Any, path: str, modeling: Any, architecture: str
) -> tuple[dict, Any, int | None]:
    """``raw`` cut to the first of ``PROBE_LAYERS`` layer counts that keeps
    every feature of the full config (same spec but for values: a per-layer
    pattern of sliding and full layers needs enough of them), else ``raw``
    itself."""
    key = next((k for k in LAYER_KEYS if isinstance(_current(k, raw, resolved), int)), None)
    layers = _current(key, raw, resolved) if key else None
    if key is None or not isinstance(layers, int) or layers <= PROBE_LAYERS[0]:
        return raw, resolved, None
    full = None
    for count in (c for c in PROBE_LAYERS if c < layers):
        fewer = with_field(raw, key, count)
        try:
            fewer_resolved = resolve_config(fewer, path)
            _read_properties(fewer_resolved)
            full = full or _research(raw, resolved, path, modeling, architecture)
            cut = _research(fewer, fewer_resolved, path, modeling, architecture)
        except Exception:  # noqa: BLE001 - the config class refuses the cut: probe the full config
            return raw, resolved, None
        if full.unknown == cut.unknown and not any(
            d.needs_code_change for d in diff_specs(full.spec, cut.spec)
        ):
            return fewer, fewer_resolved, count
    return raw, resolved, None
