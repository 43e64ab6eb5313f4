"""Rerunning the validations recorded beside a port's logit test.

The record (``validated.json``, format in ``autoport_cst.validation_record``)
lists the runs a port was validated on. A run on a tiny checkpoint is
rebuilt tensor for tensor: ``build_tiny_checkpoint`` of the recorded config with
every dimension kept, the recorded weights seed and key format; a
vision-language one (``vision_tiny``: built at fixed sizes, never shrunk) from
its recorded config as it stands, by ``save_seeded_checkpoint``. A run on another
checkpoint uses the recorded directory, while it still holds the recorded
config.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autoport_cst.validation_record import RECORD, load_runs

from .tiny import TINY_DIMENSIONS

__all__ = ["RECORD", "CheckpointCache", "CheckpointGone", "load_runs", "rebuild_checkpoint", "rerun"]


class CheckpointGone(Exception):
    """A recorded checkpoint directory is missing or holds another config."""


@dataclass
class CheckpointCache:
    """The checkpoint of each recorded run, rebuilt once per config and seed."""

    directory: Path
    built: dict[str, Path] = field(default_factory=dict)

    def get(self, run: dict[str, Any]) -> Path:
        if "weights_seed" not in run:
            return _recorded_directory(run)
        key = json.dumps([run["config"], run["weights_seed"]], sort_keys=True)
        if key not in self.built:
            self.built[key] = rebuild_checkpoint(run, self.directory / f"checkpoint{len(self.built)}")
        return self.built[key]


def _recorded_directory(run: dict[str, Any]) -> Path:
    directory = Path(run["checkpoint_dir"])
    config = directory / "config.json"
    if not config.is_file():
        raise CheckpointGone(f"{run['label']}: the recorded checkpoint {directory} is not there")
    if json.loads(config.read_text(encoding="utf-8")) != run["config"]:
        raise CheckpointGone(f"{run['label']}: {config} is no longer the config the port was validated on")
    return directory


def rebuild_checkpoint(run: dict[str, Any], outdir: Path) -> Path:
    """The tiny checkpoint of a recorded run: its config with every
    dimension kept, random weights from its seed. Raises ValueError when
    the rebuilt config differs from the recorded one."""
    from .tiny import build_tiny_checkpoint

    config = run["config"]
    if "vision_config" in config:
        return _rebuild_vision_language(run, outdir)
    source = outdir / "recorded"
    source.mkdir(parents=True, exist_ok=True)
    (source / "config.json").write_text(json.dumps(config), encoding="utf-8")
    kept = {k: v for k, v in config.items() if k in TINY_DIMENSIONS and isinstance(v, int)}
    built = build_tiny_checkpoint(
        source / "config.json",
        outdir / "checkpoint",
        run["weights_seed"],
        kept,
        key_format=run.get("key_format", "model"),
        keep_layer_kinds=True,
    )
    _check_config(run, built.directory)
    return built.directory


def _rebuild_vision_language(run: dict[str, Any], outdir: Path) -> Path:
    """A vision-language tiny checkpoint: its recorded config is the tiny one
    (``vision_tiny`` sizes it, nothing shrinks it), so the weights are drawn
    for that config as it stands."""
    import transformers

    from .tiny import save_seeded_checkpoint

    config = run["config"]
    architecture = (config.get("architectures") or [None])[0]
    model_class = getattr(transformers, architecture or "", None)
    if model_class is None:
        raise ValueError(f"{run['label']}: transformers has no class {architecture!r} to rebuild")
    directory = outdir / "checkpoint"
    save_seeded_checkpoint(
        directory,
        model_class,
        model_class.config_class.from_dict(config),
        run["weights_seed"],
        run.get("key_format", "model"),
    )
    _check_config(run, directory)
    return directory


def _check_config(run: dict[str, Any], directory: Path) -> None:
    """Raises ValueError when the config written to ``directory`` is not the
    recorded one."""
    rebuilt = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    differing = sorted(k for k in run["config"] if rebuilt.get(k) != run["config"][k])
    if differing:
        raise ValueError(f"{run['label']}: the rebuilt checkpoint's config differs in {', '.join(differing)}")


def rerun(package_dir: str | Path, run: dict[str, Any], checkpoint: Path):
    """Validate the port again as recorded; returns the ValidationReport (a
    vision-language checkpoint's: ``validate_vlm``'s)."""
    from autoport_cst.config_json import checkpoint_is_vision_language

    from .api import validate_model

    if checkpoint_is_vision_language(checkpoint):
        from .vision_validate import validate_vlm

        settings = {key: run[key] for key in ("dtype", "steps", "seed", "tp")}
        return validate_vlm(package_dir, checkpoint, **settings)
    return validate_model(
        package_dir,
        checkpoint,
        tp=run["tp"],
        ep=run.get("ep", 1),
        dtype=run["dtype"],
        steps=run["steps"],
        seed=run["seed"],
        **run.get("options", {}),
    )
