"""What a port assumes about the config it is used with.

The research varied every config field the modeling code reads
(:mod:`autoport_cst.research.config_dependence`); here each change it saw is
judged against the port a plan makes from a reference:

- a ``value`` field is read from the config at run time by every
  reference: a size (``SIZES``) always, another value (the epsilon, the RoPE
  base, the window) from the field that holds it, so a change that does not
  carry the varied field's value (Gemma 3's window under
  ``use_bidirectional_attention``) is a computation the port does not make;
- an ``optional`` field the port has (a softcap, a multiplier) is read from
  the config by the codemod that realized it, absence included; the
  attention scale and the logits divisor only when the port reads them by
  their config field (``attention.scale_key``, ``lm_head.logits_key``);
- a ``feature`` the reference reads from the config (``config_driven`` in
  its manifest, for the varied value) follows at run time;
- anything else (a feature realized once by a codemod, a field the research
  can no longer classify) is **baked in**: the field gets a guard, so that
  the port refuses a config with another value (``config-guards``).

A field whose variation changed nothing the research sees is neither. The
fields read at run time are those the validation of a port varies, but for
those that change sizes (``SIZES``): the tiny validation checkpoint differs
from a planned real config in them already, a variant that grows them only
measures the fp32 rounding of a larger model, and a size varied with the
field it relates to (``head_dim`` with ``query_pre_attn_scalar``, both
doubled) would hide the relation.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from autoport_cst.spec import ArchSpec, get_field
from autoport_cst.spec.model import FEATURE, OPTIONAL, VALUE

GUARD_CODEMOD = "config-guards"
# spec fields that are sizes: every reference reads them from the config, and
# the tiny validation checkpoint already differs from a planned real config in
# them; a variant that grows them only measures fp32 rounding of a larger model
SIZES = (
    "hidden_size",
    "num_layers",
    "max_position_embeddings",
    "attention.num_heads",
    "attention.num_kv_heads",
    "attention.head_dim",
    "attention.layer_types",
    "attention.q_lora_rank",
    "attention.kv_lora_rank",
    "attention.qk_nope_head_dim",
    "attention.qk_rope_head_dim",
    "attention.v_head_dim",
    "mlp.intermediate_size",
    "embedding.vocab_size",
    "moe.num_experts",
    "moe.top_k",
    "moe.intermediate_size",
)
# optional fields a port reads at run time only through their config field
RUNTIME_KEYS = {"attention.scale": "attention.scale_key", "lm_head.logits_divisor": "lm_head.logits_key"}
# features a port reads from the config under another key when its checkpoint.config_keys names
# them (GPT-J's partial_rotary_factor: rotary_dim / (n_embd // n_head)); the key map itself only
# says where a port finds fields, and a config holding a field under the port's name is read as it is
CONFIG_KEY_FIELDS = {"rope.partial_rotary_factor": "partial_rotary_factor"}


@dataclass(frozen=True)
class Guard:
    """A config value the port's code was written for: ``value`` itself, or
    for a list of per-layer types (``layer_types``), entries among
    ``allowed``."""

    field: str
    value: Any
    default: Any
    fixes: tuple[str, ...]  # the spec fields the port's code fixes for that value
    varied: Any  # a value the port refuses
    allowed: tuple[Any, ...] | None = None
    # for a per-layer list: the config field every entry must equal (the value the port reads);
    # for a single value: the config field it must equal (a relation the model needs)
    same_as: str | None = None
    # values the model's own code sets in place of ``value`` (None): the same model, accepted
    also: tuple[Any, ...] = ()

    def params(self) -> dict[str, Any]:
        params = {
            "field": self.field,
            "value": self.value,
            "default": self.default,
            "fixes": ", ".join(self.fixes),
        }
        if self.allowed is not None:
            params["allowed"] = list(self.allowed)
        if self.same_as is not None:
            params["same_as"] = self.same_as
        if self.also:
            params["also"] = list(self.also)
        return params

    def refused_entry(self) -> Any:
        """The value (for a list: the entry) the refusal must name."""
        if self.allowed is not None:
            return next(v for v in self.varied if v not in self.allowed)
        if self.same_as is not None and not isinstance(self.value, list):
            return self.varied
        if self.same_as is not None:
            return next(v for v, w in zip(self.varied, self.value, strict=True) if v != w)
        return self.varied


@dataclass(frozen=True)
class ConfigAssumptions:
    guards: tuple[Guard, ...] = ()
    runtime: tuple[str, ...] = ()  # fields the port reads at run time (the validation varies them)
    sizes: tuple[str, ...] = ()  # fields the port reads at run time that change sizes (not varied)
    unseen: tuple[str, ...] = ()  # fields whose variation changed nothing the research sees
    inconclusive: tuple[tuple[str, str], ...] = ()  # (field, why the varied config was not researched)

    def step(self) -> dict[str, Any] | None:
        """The plan step that writes the guards, or None without any."""
        if not self.guards:
            return None
        return {"codemod": GUARD_CODEMOD, "params": {"assumed": [g.params() for g in self.guards]}}


def config_assumptions(dependence: Any, spec: ArchSpec, config_driven: dict[str, Any]) -> ConfigAssumptions:
    """Judge every probe of ``dependence`` (a ``ConfigDependence``) against a
    port of ``spec`` whose reference reads ``config_driven`` at run time. A
    probe of a field the code reads only under another field's variation
    (``given``) is charged to that other field."""
    probes = list(dependence.probes) if dependence is not None else []
    judged = [(p, baked(p, spec, config_driven)) for p in probes if p.error is None]
    inconclusive = tuple((_label(p), p.error) for p in probes if p.error is not None)
    guards: list[Guard] = []
    runtime: list[str] = []
    sizes: list[str] = []
    unseen: list[str] = []
    related = _relations(judged)
    for name in dict.fromkeys(p.field for p, _ in judged if not p.given and not p.together):
        own = [(p, fixed) for p, fixed in judged if p.field == name and not p.given and not p.together]
        under = [(p, fixed) for p, fixed in judged if p.given and p.given[0][0] == name]
        if name in related:
            own = [related[name], *(pair for pair in own if pair[0].varied != related[name][0].varied)]
        guard = _guard(name, own, under)
        if guard is not None:
            guards.append(guard)
        elif not any(p.changes for p, _ in own + under):
            unseen.append(name)
        elif any(c.path in SIZES for p, _ in own + under for c in p.changes):
            sizes.append(name)
        else:
            runtime.append(name)
    guards += _per_layer_guards(dependence)
    guards += [_relation_guard(p, judged) for p, fixed in judged if p.together and not fixed]
    written = dict(getattr(dependence, "written", ()))
    guards = [_with_written(g, written) for g in guards]
    return ConfigAssumptions(tuple(guards), tuple(runtime), tuple(sizes), tuple(unseen), inconclusive)


def _with_written(guard: Guard, written: dict[str, Any]) -> Guard:
    """``guard`` accepting, for a field planned None, the value the model's
    own construction sets in its place (``ConfigDependence.written``): a
    config that states it (any ``save_pretrained`` of a loaded Falcon-40B
    holds ``num_ln_in_parallel_attn: 2``) is the model the port was made for."""
    value = written.get(guard.field)
    if guard.value is not None or value is None or guard.allowed is not None or guard.same_as is not None:
        return guard
    return replace(guard, also=(value,))


def _relations(judged: list) -> dict[str, tuple[Any, tuple[str, ...]]]:
    """For each of two fields varied together that the port follows
    (``together``: each alone leaves the model unsupported), the joint
    probe stands for its own: the lone variation is refused by the relation
    guard (:func:`_relation_guard`), not by a guard on its value."""
    related: dict[str, tuple[Any, tuple[str, ...]]] = {}
    for probe, fixed in judged:
        if probe.together and not fixed:
            related[probe.field] = related[probe.together] = (probe, fixed)
    return related


def _relation_guard(joint: Any, judged: list) -> Guard:
    """``joint.field`` must equal ``joint.together`` (Falcon without
    multi-query: num_kv_heads equal to num_attention_heads); refused example:
    the field varied alone."""
    alone = next(
        (fixed for p, fixed in judged if p.field == joint.field and not p.given and not p.together), ()
    )
    fixes = alone or ("unsupported",)
    return Guard(joint.field, joint.value, joint.default, fixes, joint.varied, same_as=joint.together)


def _per_layer_guards(dependence: Any) -> list[Guard]:
    """A guard per list whose entries the code uses in place of a field's
    value (``dependence.per_layer``: GraniteSWA rotates each layer by its
    ``layer_rope_theta`` entry, not by ``rope_theta``): a port reads the
    field, so each entry must equal it. Refused example: the last entry
    doubled."""
    guards = []
    for name, field, planned in getattr(dependence, "per_layer", ()):
        varied = [*planned[:-1], planned[-1] * 2 if planned[-1] else 1.0]
        guards.append(Guard(name, list(planned), None, ("rope.theta",), varied, same_as=field))
    return guards


def _guard(name: str, own: list, under: list) -> Guard | None:
    """The guard of field ``name`` from its probes (``own``) and those of the
    fields its variations made the code read (``under``), or None."""
    refused: list[tuple[Any, tuple[str, ...]]] = [(p.varied, fixed) for p, fixed in own if fixed]
    refused += [(p.given[0][2], fixed) for p, fixed in under if fixed]
    if not refused:
        return None
    first = own[0][0]
    fixes = tuple(dict.fromkeys(path for _, fixed in refused for path in fixed))
    if isinstance(first.value, list):
        bad = {v[-1] for v, _ in refused}
        allowed = tuple(
            dict.fromkeys([*first.value, *(p.varied[-1] for p, _ in own if p.varied[-1] not in bad)])
        )
        # absent, a list of per-layer types is derived by the config class: not checked
        return Guard(name, first.value, None, fixes, refused[0][0], allowed)
    return Guard(name, first.value, first.default, fixes, refused[0][0])


def _holds(value: Any, varied: Any) -> bool:
    """``value`` (a spec value) is, or holds, the varied config value."""
    if isinstance(value, dict):
        return any(_holds(v, varied) for v in value.values())
    if isinstance(value, (list, tuple)) and not isinstance(varied, (list, tuple)):
        return any(_holds(v, varied) for v in value)
    return value == varied


def _label(probe: Any) -> str:
    given = "".join(f" (with {f} = {v!r})" for f, _, v in probe.given)
    return f"{probe.field}{given}"


def baked(probe: Any, spec: ArchSpec, config_driven: dict[str, Any]) -> tuple[str, ...]:
    """The spec fields a port of ``spec`` fixes in code that ``probe``'s
    variation changes (or leaves unclassified); empty when it follows."""
    paths = [c.path for c in probe.changes if _fixed(c, probe.varied, spec, config_driven)]
    paths += list(probe.unknown)
    named = [p for p in dict.fromkeys(paths) if p != "unsupported"]
    return tuple(named or dict.fromkeys(paths))


def _fixed(change: Any, varied: Any, spec: ArchSpec, config_driven: dict[str, Any]) -> bool:
    """Whether a port of ``spec`` keeps ``change.planned`` where a config
    with the varied field (set to ``varied``) computes ``change.varied``."""
    if change.role == VALUE:
        # a size is read from its config field by every reference (and derived
        # from them as transformers does); another value is read from the field
        # that holds it: a value that does not follow the varied field comes
        # from a computation the port does not make (Gemma 3's window under
        # use_bidirectional_attention)
        return change.path not in SIZES and not _holds(change.varied, varied)
    if change.role == OPTIONAL:
        key = RUNTIME_KEYS.get(change.path)
        if key is not None:
            return get_field(spec, key) is None
        if get_field(spec, change.path) is not None:
            return False
        return (change.planned is None) != (change.varied is None)
    if change.role == FEATURE:
        if change.path == "checkpoint.config_keys":
            return False
        if CONFIG_KEY_FIELDS.get(change.path) in (spec.checkpoint.config_keys or {}):
            return False
        allowed = config_driven.get(change.path)
        return not (allowed == "*" or (isinstance(allowed, list) and change.varied in allowed))
    return False
