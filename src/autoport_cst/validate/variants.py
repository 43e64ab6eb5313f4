"""Configs that differ from the one a port was validated on.

A port is registered for an architecture, so its validation goes beyond the
config it was planned on (``autoport_cst.plan.assumptions`` says which
fields a port reads at run time and which it guards):

- :func:`variant_values` varies, at once, every config field the port reads
  at run time (sizes, epsilon, RoPE base, softcaps, window, an attention
  scale read from its field...), each the way the research varied it (a
  number doubled, a boolean flipped); :func:`build_variant_checkpoint`
  builds a random checkpoint of exactly that config (no shrinking), which
  the port must validate on;
- :func:`guard_checks` builds the port (on the meta device, as the engine
  does) from configs that each break one guarded assumption: it must refuse
  every one with a ``ValueError`` naming the field and both values.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autoport_cst.config_json import config_object, load_config_values
from autoport_cst.research.config_dependence import can_vary, varied_value, with_field


@dataclass(frozen=True)
class GuardCheck:
    """The port built from a config with ``field`` set to ``value`` (it was
    made for ``expected``): ``refused`` when it raised naming the field and
    both values."""

    field: str
    value: Any
    expected: Any
    refused: bool
    message: str


def read_values(checkpoint_dir: str | Path) -> dict[str, Any]:
    """The config.json values of a checkpoint directory (read as transformers
    reads them: ``config_json``)."""
    return load_config_values(Path(checkpoint_dir) / "config.json")


def variant_values(
    base: dict[str, Any],
    fields: Sequence[str],
    tied: Sequence[tuple[str, str]] = (),
    given: dict[str, Any] | None = None,
) -> tuple[dict[str, Any], dict[str, tuple[Any, Any]]]:
    """``base`` with every field of ``fields`` (dotted into dicts) varied, and
    ``{field: (before, after)}``. A field ``base`` lacks, or that has no other
    value to try, stays; ``given``: the value to try for a field that is None
    (the research's variation of it, by its class's annotation: MPT's
    ``attn_config.softmax_scale``). ``tied``: (list, field) pairs whose list
    holds per layer the value the model uses in place of the field's
    (GraniteSWA's ``layer_rope_theta`` for ``rope_parameters.rope_theta``,
    which its port guards to be equal): the entries equal to a varied field's
    value follow it."""
    values = base
    changed: dict[str, tuple[Any, Any]] = {}
    for name in fields:
        found, current = _lookup(values, name)
        if found and current is None and name in (given or {}):
            new = (given or {})[name]
        elif not found or not can_vary(current):
            continue
        else:
            new = varied_value(current)
        values = with_field(values, name, new)
        changed[name] = (current, new)
    for name, field_name in tied:
        found, entries = _lookup(values, name)
        if field_name not in changed or not found or not isinstance(entries, list):
            continue
        before, after = changed[field_name]
        followed = [after if entry == before else entry for entry in entries]
        values = with_field(values, name, followed)
        changed[name] = (entries, followed)
    return values, changed


def build_variant_checkpoint(
    values: dict[str, Any], directory: str | Path, seed: int = 0, key_format: str = "model"
) -> Path:
    """A random checkpoint (config.json + model.safetensors) of exactly the
    config ``values``, deterministic per seed, built as ``tiny`` builds its
    checkpoints (tied tensors once, constant tensors perturbed, tensors named
    as ``key_format`` says: ``tiny.save_seeded_checkpoint``)."""
    import transformers

    from .tiny import save_seeded_checkpoint

    config = config_object({k: v for k, v in values.items() if k != "transformers_version"})
    architecture = (values.get("architectures") or [None])[0]
    model_class = getattr(transformers, architecture or "", None)
    if model_class is None:
        raise ValueError(f"transformers has no class {architecture!r}")
    save_seeded_checkpoint(directory, model_class, config, seed, key_format)
    return Path(directory)


def guard_checks(
    package_dir: str | Path, base: dict[str, Any], guards: Sequence[Any], checkpoint_dir: str | Path
) -> list[GuardCheck]:
    """Build the port from ``base`` with each guard's field set to its varied
    value (``guards``: ``autoport_cst.plan.assumptions.Guard``); each must be
    refused by name."""
    if not guards:
        return []
    from .package import imported_package
    from .standin import standin_installed

    checks = []
    with standin_installed(model=str(checkpoint_dir)), imported_package(package_dir) as package:
        for guard in guards:
            values = with_field(base, guard.field, guard.varied)
            checks.append(_check(package.factory, values, guard))
    return checks


def _check(factory: Any, values: dict[str, Any], guard: Any) -> GuardCheck:
    import torch

    try:
        with torch.device("meta"):
            factory.from_configs(_hf_config(values), None)
    except ValueError as error:
        message = str(error)
        # the field and both values; for a list of per-layer types, the entry refused
        terms = [guard.field, repr(guard.refused_entry())]
        if getattr(guard, "same_as", None) is not None:  # each entry must equal that field
            terms.append(guard.same_as)
        else:
            terms += [repr(guard.value)] if guard.allowed is None else [repr(a) for a in guard.allowed]
        named = all(text in message for text in terms)
        return GuardCheck(guard.field, guard.varied, guard.value, named, message)
    except Exception as error:  # noqa: BLE001 - the port failed some other way: not a refusal
        return GuardCheck(guard.field, guard.varied, guard.value, False, f"{type(error).__name__}: {error}")
    return GuardCheck(guard.field, guard.varied, guard.value, False, "the port built the model")


def _hf_config(values: dict[str, Any]) -> Any:
    """The ``PretrainedConfig`` the engine would hand over, or the values
    themselves when transformers refuses the varied value."""
    try:
        return config_object({k: v for k, v in values.items() if k != "transformers_version"})
    except Exception:  # noqa: BLE001 - the config class validates the value
        return values


def _lookup(values: dict[str, Any], name: str) -> tuple[bool, Any]:
    value: Any = values
    for part in name.split("."):
        if not isinstance(value, dict) or part not in value:
            return False, None
        value = value[part]
    return True, value
