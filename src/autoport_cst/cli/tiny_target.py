"""What ``autoport-cst tiny`` reads and where it may write: checked before
torch is imported.

A config.json source (a path: ``validate.tiny.source_is_path``) must exist,
parse, hold an object and name a model_type transformers knows
(``check_config_source``), as ``plan`` checks its source before torch.

OUTDIR may be new, empty, or hold a tiny checkpoint of the same model that
``tiny`` wrote before (its ``model.safetensors`` carries the ``key_format``
metadata ``tiny`` writes): a second run with another seed or ``--set``
replaces it, as the README's one-liner does when run again. Anything else
(a checkpoint of another model, a checkpoint ``tiny`` did not write, other
files) is refused with exit 2, naming the directory and what it holds,
unless ``--force``.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

from autoport_cst.config_json import parse_config_text
from autoport_cst.errors import InputError, Position, did_you_mean

_HEADER_LIMIT = 100_000_000


@dataclass(frozen=True)
class HeldCheckpoint:
    """The checkpoint a directory holds, as its config.json names it."""

    model_type: str | None
    architectures: tuple[str, ...]
    tiny: bool  # written by ``autoport-cst tiny``

    def describe(self) -> str:
        kind = "a tiny checkpoint (written by `autoport-cst tiny`)" if self.tiny else "a checkpoint"
        names = ", ".join(self.architectures) or "no architectures"
        return f"{kind} of model_type {self.model_type!r} ({names})"


def check_config_source(source: str) -> None:
    """A config.json source (or a directory holding one) that ``tiny`` can
    read: refused with its position before torch (it was judged after the
    torch import, 3 s of CPU, by ``resolve_config``)."""
    from autoport_cst.validate.tiny import known_model_types

    path = Path(source)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise InputError(f"{path}: no such config file")
    try:
        values = parse_config_text(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as error:
        raise InputError(f"cannot read {path}: {error}") from None
    except json.JSONDecodeError as error:
        raise InputError(
            f"invalid JSON: {error.msg}", Position(str(path), error.lineno, error.colno)
        ) from None
    if not isinstance(values, dict):
        raise InputError("a config.json holds a JSON object", Position(str(path), json_path="$"))
    model_type = values.get("model_type")
    known = known_model_types()
    if known is not None and model_type not in known:
        hint = did_you_mean(model_type, sorted(known)) if isinstance(model_type, str) else ""
        raise InputError(
            f"unknown or missing model_type {model_type!r}{hint}",
            Position(str(path), json_path="$.model_type"),
        )


def check_causal_lm_model_type(model_type: str) -> None:
    """A model_type transformers knows but has no causal-LM class for
    (``tiny vit``): refused before torch (``resolve_config`` said so after
    the torch import)."""
    causal = causal_lm_model_types()
    if causal is None or model_type in causal:
        return
    from autoport_cst.validate.tiny import known_model_types

    if model_type in (known_model_types() or ()):
        raise InputError(
            f"model_type {model_type!r} has no causal-LM class in transformers: tiny builds decoder "
            "language models (an architecture name or a config.json of one)"
        )


def causal_lm_model_types() -> frozenset[str] | None:
    """The keys of transformers' ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``,
    read from ``modeling_auto``'s source (importing it imports torch): the
    literal list of its assignment. None when it is written otherwise."""
    import ast
    import importlib.util

    name = "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES = OrderedDict("
    try:
        spec = importlib.util.find_spec("transformers.models.auto.modeling_auto")
        source = Path(spec.origin).read_text(encoding="utf-8") if spec and spec.origin else ""
        start = source.index(name)
        call = ast.parse(source[start + len(name) - len("OrderedDict(") : source.index("\n)\n", start) + 2])
        pairs = ast.literal_eval(call.body[0].value.args[0])  # type: ignore[attr-defined]
        return frozenset(key for key, _ in pairs)
    except (ImportError, OSError, ValueError, SyntaxError, AttributeError, IndexError, TypeError):
        return None


def check_tiny_outdir(outdir: Path, source: str, source_is_path: bool) -> None:
    """Refuse an OUTDIR whose contents ``tiny`` would overwrite and that is
    not a tiny checkpoint of the same model (see the module docstring)."""
    if not outdir.is_dir():
        return
    entries = sorted(p.name for p in outdir.iterdir())
    if not entries:
        return
    held = held_checkpoint(outdir)
    if held is not None and held.tiny and _same_model(held, source, source_is_path):
        return
    if held is not None:
        what = f"holds {held.describe()}"
    else:
        shown = ", ".join(entries[:5]) + (f" and {len(entries) - 5} more" if len(entries) > 5 else "")
        what = f"is not empty and holds no checkpoint ({len(entries)} entries: {shown})"
    raise InputError(
        f"OUTDIR {what}; `tiny {source}` would overwrite its config.json, model.safetensors and "
        "tokenizer files: give a new or empty directory, or --force to write over it",
        Position(str(outdir)),
    )


def check_forced_outdir(outdir: Path) -> None:
    """``--force`` over weight files ``tiny`` does not write (shards and
    their index, ``.bin`` files): refused, as the checkpoint would mix both
    (the index names the old shards to a reader that follows it)."""
    if not outdir.is_dir():
        return
    foreign = sorted(
        p.name
        for p in outdir.iterdir()
        if p.name != "model.safetensors"
        and p.name.endswith((".safetensors", ".safetensors.index.json", ".bin"))
    )
    if foreign:
        shown = ", ".join(foreign[:4]) + (f" and {len(foreign) - 4} more" if len(foreign) > 4 else "")
        raise InputError(
            f"OUTDIR holds weight files tiny does not write ({shown}); its config.json and "
            "model.safetensors would be replaced beside them, a checkpoint of both: remove them or give "
            "another directory",
            Position(str(outdir)),
        )


def held_checkpoint(directory: Path) -> HeldCheckpoint | None:
    """The checkpoint ``directory`` holds (None without a readable config.json)."""
    from autoport_cst.validate.tiny import KEY_FORMAT  # the safetensors metadata tiny writes

    config = _config_named(directory / "config.json")
    if config is None:
        return None
    return HeldCheckpoint(*config, KEY_FORMAT in _safetensors_metadata(directory / "model.safetensors"))


def _config_named(path: Path) -> tuple[str | None, tuple[str, ...]] | None:
    """The model_type and architectures a config.json names."""
    try:
        values = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    if not isinstance(values, dict):
        return None
    model_type = values.get("model_type")
    architectures = values.get("architectures")
    return (
        model_type if isinstance(model_type, str) else None,
        tuple(a for a in architectures if isinstance(a, str)) if isinstance(architectures, list) else (),
    )


def _safetensors_metadata(path: Path) -> dict:
    try:
        with path.open("rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            if length > _HEADER_LIMIT:
                return {}
            header = json.loads(handle.read(length))
    except (OSError, struct.error, ValueError):
        return {}
    metadata = header.get("__metadata__") if isinstance(header, dict) else None
    return metadata if isinstance(metadata, dict) else {}


def _same_model(held: HeldCheckpoint, source: str, source_is_path: bool) -> bool:
    if not source_is_path:
        return source == held.model_type or source in held.architectures
    path = Path(source)
    wanted = _config_named(path / "config.json" if path.is_dir() else path)
    if wanted is None or wanted[0] != held.model_type:
        return False
    return not wanted[1] or wanted[1][:1] == held.architectures[:1]
