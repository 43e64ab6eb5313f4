"""Input checks the commands run before they import torch or transformers
(seconds of imports): paths, names, config.json, the safetensors files, TP
sizes against the tensor-parallel rules, the hub's reachability, and the
installed extra. Each raises ``InputError`` (exit code 2) with the file or
the option it is about; none of them writes anything."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

from autoport_cst.config_json import parse_config_text
from autoport_cst.errors import InputError, Position

MODEL_EXTRA = "pip install 'autoport-cst[validate]'"


def require_extra(command: str, modules: tuple[str, ...] = ("torch", "transformers", "safetensors")) -> None:
    """Refuse a command whose libraries a core-only install lacks, naming
    the extra that brings them."""
    missing = [name for name in modules if importlib.util.find_spec(name) is None]
    if missing:
        raise InputError(
            f"`autoport-cst {command}` needs {' and '.join(missing)}, which a core install does not "
            f"include: {MODEL_EXTRA}"
        )


def check_model_name(name: str, option: str = "--name") -> None:
    from autoport_cst.plan.naming import model_name_problem

    problem = model_name_problem(name)
    if problem is not None:
        raise InputError(f"{option} {problem}")


def default_model_name(config: dict | None, source: str, option: str = "--name") -> str:
    """The model name when ``option`` is not given: the checkpoint's
    ``model_type`` made a package name (``plan.naming.name_for_model_type``)."""
    from autoport_cst.plan.naming import name_for_model_type

    model_type = (config or {}).get("model_type")
    if not isinstance(model_type, str) or not model_type:
        why = (
            "a hub id's config is read only later" if config is None else "its config.json has no model_type"
        )
        raise InputError(f"{source}: give {option} ({why}, so no name can be derived from it)")
    return name_for_model_type(model_type)


def check_one_port_per_architecture(out: Path, config: dict | None, name: str, source: str) -> None:
    """``port`` into an ``out`` whose registry already maps the checkpoint's
    architecture to a port of another name: refused before the research (the
    register-model step would refuse it after), naming ``--force``."""
    registry = Path(out) / "vllm_neuron" / "model" / "registry.py"
    architectures = (config or {}).get("architectures") or [None]
    if not isinstance(architectures[0], str) or not registry.is_file():
        return
    text = registry.read_text(encoding="utf-8")
    entry = re.search(rf"""\(\s*["']{re.escape(architectures[0])}["']\s*,\s*(\w+)\s*\)""", text)
    if entry is None:
        return
    imported = re.search(
        rf"^from\s+(?:vllm_neuron\.model)?\.(\w+)[\w.]*\s+import\b[^\n]*\b{entry.group(1)}\b", text, re.M
    )
    if imported is not None and imported.group(1) == name:
        return  # this port again: apply says what --force replaces
    line = text.count("\n", 0, entry.start()) + 1
    raise InputError(
        f"{out} already holds a port of {architectures[0]} (its registry maps each architecture to one "
        f"port): port into another --out, or map the architecture to this port instead: autoport-cst port "
        f"{source} --name {name} --out {out} --force\n({registry}:{line}: the registry maps "
        f"{architectures[0]!r} to {entry.group(1)}; --force replaces that entry)"
    )


def check_reference(ref: str | None) -> None:
    """A --ref that is neither a built-in reference nor a reference directory."""
    if ref:
        from autoport_cst.apply.reference import resolve_reference

        resolve_reference(ref)


def check_source(source: str, tp: int = 1) -> dict | None:
    """A SOURCE of ``plan`` and ``port``: a checkpoint directory (or its
    config.json) whose config and safetensors headers read, and whose model
    the TP rules let split at ``tp``; or a hub id, with the hub reachable.
    Returns the local config's values (None for a hub id)."""
    from autoport_cst.research.hub import HUB_ID, check_hub_reachable

    path = Path(source)
    if not path.exists():
        if HUB_ID.match(source) and not source.startswith((".", "/", "~")):
            check_hub_reachable(source)
            return None
        raise InputError(f"{source}: no such directory, and not a hub id (owner/name)")
    if path.is_file() and path.name != "config.json":
        raise InputError(f"{source}: expected a checkpoint directory (with config.json) or a hub id")
    directory = path if path.is_dir() else path.parent
    from autoport_cst.research.checkpoint import read_checkpoint
    from autoport_cst.research.config_analysis import read_config

    config = read_config(directory / "config.json")
    read_checkpoint(directory)  # headers, and each file's size against them
    check_tp(config, tp, directory / "config.json")
    return config


def check_checkpoint_dir(directory: Path, tp: int = 1) -> dict:
    """The --hf checkpoint of ``validate``: config.json (valid JSON) and
    safetensors files whose sizes match their headers; TP rules."""
    from autoport_cst.research.checkpoint import read_checkpoint

    directory = Path(directory)
    if not directory.is_dir():
        raise InputError(f"{directory}: no such checkpoint directory")
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise InputError(f"{directory}: no config.json")
    try:
        config = parse_config_text(config_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as error:
        raise InputError(f"cannot read {config_path}: {error}") from None
    except json.JSONDecodeError as error:
        raise InputError(
            f"malformed JSON: {error.msg}", Position(str(config_path), error.lineno, error.colno)
        ) from None
    if not isinstance(config, dict):
        raise InputError("config.json must hold a JSON object", Position(str(config_path), json_path="$"))
    if read_checkpoint(directory) is None:
        raise InputError(f"{directory}: no .safetensors file")
    check_tp(config, tp, config_path)
    return config


def check_tp(config: dict, tp: int, config_path: Path) -> None:
    """--tp against the tensor-parallel rules (research.parallelism), before
    any rank process starts."""
    from autoport_cst.research.parallelism import tp_refusal

    if tp < 1:
        raise InputError(f"--tp must be at least 1, got {tp}")
    refusal = tp_refusal(config, tp)
    if refusal is not None:
        raise InputError(f"--tp {tp}: {refusal} (sizes from {config_path})")


def check_output_file(path: Path | None, option: str) -> None:
    """An output file option (-o, --json) that names a directory."""
    if path is not None and Path(path).is_dir():
        raise InputError(f"{option} {path}: is a directory; give a file name")
