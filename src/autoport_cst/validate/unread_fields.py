"""Config fields the port reads and transformers never does.

A checkpoint's config.json may carry a value the model's code ignores:
BioGPT's ``layer_norm_eps`` is 1e-12, and transformers builds its norms with
the default 1e-5. A port that reads the field computes something else, yet
on a tiny checkpoint the two epsilons differ below every tolerance, so the
plain comparison passes and the port is registered for every BioGPT
checkpoint with a silent difference in each norm.

So the fp32 reference run records which attributes transformers reads from
its config objects while it loads and runs the model
(:func:`recording_config_reads`). A float field of config.json it never read,
whose value the port's config dataclass holds (under the same name, or any
name holding that nonzero value: a field the port renamed), is a field the
port may compute with where transformers does not
(:func:`unread_fields`). The validation then runs once more with each such
field set far from its value (:func:`far_value`: an epsilon of 1e-12 becomes
0.5) on a checkpoint that differs from the validated one only in its
config.json (:func:`check_unread_fields`). transformers is run on it too, so
whatever it reads, the comparison is the ordinary one: a port that reads the
field fails it, one that does not passes.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from autoport_cst.errors import InputError

from .config_variants import raised_in_transformers

LABEL = "config fields transformers never reads"


@contextmanager
def recording_config_reads() -> Iterator[set[str]]:
    """Within: the name of every attribute read from a transformers config
    object (of any class, any sub-config) by code outside the config classes
    is added to the yielded set. The config's own methods are left out: its
    validation reads every field once while it is built. (A field the model
    reads only through a property of its config class is then not counted
    as read: it is varied, at the cost of a run, never of a verdict.)"""
    from transformers import PretrainedConfig

    reads: set[str] = set()
    own = "__getattribute__" in vars(PretrainedConfig)
    original = PretrainedConfig.__getattribute__

    def reading(self: Any, name: str) -> Any:
        if not _config_code(sys._getframe(1).f_code.co_filename):
            reads.add(name)
        return original(self, name)

    PretrainedConfig.__getattribute__ = reading  # type: ignore[method-assign]
    try:
        yield reads
    finally:
        if own:
            PretrainedConfig.__getattribute__ = original  # type: ignore[method-assign]
        else:
            del PretrainedConfig.__getattribute__


def _config_code(filename: str) -> bool:
    """Whether a file holds config classes (transformers' ``configuration_*.py``)
    or the dataclass validation they are built with (huggingface_hub)."""
    name = os.path.basename(filename)
    return name.startswith("configuration_") or f"{os.sep}huggingface_hub{os.sep}" in filename


def port_float_values(config: Any) -> dict[str, float]:
    """The float fields of a port's config dataclass (``{}`` for another kind of config)."""
    if config is None or not dataclasses.is_dataclass(config) or isinstance(config, type):
        return {}
    values = {f.name: getattr(config, f.name, None) for f in dataclasses.fields(config)}
    return {name: value for name, value in values.items() if type(value) is float}


def unread_fields(
    config: dict[str, Any], reads: set[str] | frozenset[str] | None, port_values: dict[str, float]
) -> dict[str, float]:
    """The float fields of ``config`` (config.json's top level) that
    transformers never read (``reads``; None: not recorded) and whose value
    the port's config holds (``port_values``): by name, or a nonzero value
    held under another name, one that is not itself a field of ``config``
    transformers read (a port's ``rms_norm_eps`` read from the checkpoint's
    own ``rms_norm_eps`` explains its value)."""
    if reads is None or not port_values:
        return {}
    held = {
        value
        for name, value in port_values.items()
        if value != 0.0 and not (name in config and name in reads)
    }
    return {
        name: value
        for name, value in config.items()
        if type(value) is float
        and not name.startswith("_")
        and name not in reads
        and (name in port_values or value in held)
    }


def far_value(value: float) -> float:
    """A value far from ``value`` in every scale: ``2 v + 0.5`` (``2 v - 0.5``
    below zero), to six significant digits (an epsilon of 1e-12 becomes 0.5)."""
    return float(f"{2 * value + (0.5 if value >= 0 else -0.5):.6g}")


def varied_checkpoint(checkpoint_dir: Path, fields: dict[str, float], into: Path) -> dict[str, list[float]]:
    """A checkpoint in ``into`` whose config.json is ``checkpoint_dir``'s with
    each of ``fields`` set to its :func:`far_value` (every other file linked);
    ``{field: [before, after]}``."""
    raw = json.loads((checkpoint_dir / "config.json").read_text(encoding="utf-8"))
    changed = {name: [value, far_value(value)] for name, value in fields.items()}
    raw.update({name: pair[1] for name, pair in changed.items()})
    into.mkdir(parents=True, exist_ok=True)
    for path in checkpoint_dir.iterdir():
        if path.name != "config.json":
            (into / path.name).symlink_to(path.resolve())
    (into / "config.json").write_text(json.dumps(raw, indent=2) + "\n", encoding="utf-8")
    return changed


def check_unread_fields(report: Any, checkpoint_dir: str | Path, validate: Callable[[Path], Any]) -> None:
    """When ``report.unread_config_fields`` names fields, validate the port
    (``validate(checkpoint) -> ValidationReport``) on a checkpoint with each
    set far from its value, as an entry of ``report.config_variants``; a
    failure fails ``report``, named after the fields."""
    fields = dict(report.unread_config_fields)
    if not fields or not report.equivalent:
        return
    with tempfile.TemporaryDirectory(prefix="autoport-unread-") as scratch:
        changed = varied_checkpoint(Path(checkpoint_dir), fields, Path(scratch) / "checkpoint")
        label = f"{LABEL}: " + ", ".join(f"{name} {a!r} -> {b!r}" for name, (a, b) in changed.items())
        entry: dict[str, Any] = {"label": label, "equivalent": None, "summary": None}
        report.config_variants.append(entry)
        try:
            found = validate(Path(scratch) / "checkpoint")
        except Exception as error:
            if not (isinstance(error, InputError) or raised_in_transformers(error)):
                raise
            # transformers refuses the varied config (a check of its config class): nothing to compare
            entry["summary"] = f"not run: transformers cannot run it: {type(error).__name__}: {error}"
            return
    entry.update(equivalent=found.equivalent, summary=found.summary())
    if not found.equivalent:
        report.fail_as(f"{label} (the port reads a field the model's code ignores)", found)
