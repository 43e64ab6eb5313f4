"""What the checkpoint holds, from safetensors headers only.

A safetensors file starts with an 8-byte little-endian header length and a
JSON header mapping each tensor name to its dtype, shape and byte range; no
tensor is read, but a file whose size is not where its header's byte ranges
end (a truncated download) is refused. Sharded checkpoints are found through
``model.safetensors.index.json`` (its ``weight_map``), or as every
``*.safetensors`` file of the directory.
"""

from __future__ import annotations

import json
import math
import os
import re
import struct
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autoport_cst.errors import InputError, Position
from autoport_cst.research.findings import CHECKPOINT, INFERRED, Finding, known

MAX_HEADER = 100 * 1024 * 1024
INDEX = "model.safetensors.index.json"
DTYPE_BYTES = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "U16": 2,
    "U32": 4,
    "U64": 8,
    "F8_E8M0": 1,
    "F4": 1,
}
_LAYER_INDEX = re.compile(r"\.(\d+)\.")


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]
    file: str

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass
class CheckpointHeader:
    directory: str
    files: tuple[str, ...]
    tensors: dict[str, TensorInfo] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def parameter_count(self) -> int:
        return sum(t.numel for t in self.tensors.values())

    @property
    def dtypes(self) -> dict[str, int]:
        return dict(sorted(Counter(t.dtype for t in self.tensors.values()).items()))

    def shape(self, name: str) -> tuple[int, ...] | None:
        info = self.tensors.get(name)
        return info.shape if info is not None else None


def read_safetensors_header(path: str | Path) -> tuple[dict[str, TensorInfo], dict[str, Any]]:
    """(tensors, __metadata__) of one .safetensors file; InputError with the
    file and byte offset when the header is unreadable."""
    path = Path(path)
    try:
        with path.open("rb") as handle:
            prefix = handle.read(8)
            if len(prefix) < 8:
                raise InputError(
                    f"not a safetensors file: {len(prefix)} bytes, the 8-byte header length is missing",
                    Position(str(path)),
                )
            (length,) = struct.unpack("<Q", prefix)
            handle.seek(0, 2)
            size = handle.tell()
            if length == 0 or length > MAX_HEADER or 8 + length > size:
                raise InputError(
                    f"unreadable safetensors header: declared length {length} bytes, file size {size} bytes",
                    Position(str(path)),
                )
            handle.seek(8)
            raw = handle.read(length)
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc}") from None
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        detail = f"{exc.msg} at header byte {exc.pos}" if isinstance(exc, json.JSONDecodeError) else str(exc)
        raise InputError(f"unreadable safetensors header (JSON): {detail}", Position(str(path))) from None
    if not isinstance(header, dict):
        raise InputError("unreadable safetensors header: not a JSON object", Position(str(path)))
    metadata = header.pop("__metadata__", None) or {}
    tensors: dict[str, TensorInfo] = {}
    data_end = 0
    for name, entry in header.items():
        if not _valid_entry(entry):
            raise InputError(
                f"unreadable safetensors header: bad entry for tensor {name!r}",
                Position(str(path), json_path=f"$[{json.dumps(name)}]"),
            )
        tensors[name] = TensorInfo(name, entry["dtype"], tuple(entry["shape"]), path.name)
        data_end = max(data_end, entry["data_offsets"][1])
    _check_size(path, size, 8 + length + data_end)
    return tensors, metadata if isinstance(metadata, dict) else {}


def _valid_entry(entry: Any) -> bool:
    """A tensor entry: dtype, shape and a [begin, end] byte range."""
    if not isinstance(entry, dict) or not isinstance(entry.get("dtype"), str):
        return False
    shape, offsets = entry.get("shape"), entry.get("data_offsets")
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        return False
    return (
        isinstance(offsets, list)
        and len(offsets) == 2
        and all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
        and 0 <= offsets[0] <= offsets[1]
    )


def _check_size(path: Path, size: int, expected: int) -> None:
    """The file must end where its header's last tensor ends: a shorter file
    was cut off (an interrupted download or copy), a longer one is not what
    the header describes."""
    if size == expected:
        return
    what = "truncated" if size < expected else "longer than its header describes"
    raise InputError(
        f"corrupt safetensors file ({what}): its header's tensors end at byte {expected:,}, "
        f"the file has {size:,} bytes (expected {expected:,}, actual {size:,})",
        Position(str(path)),
    )


def read_checkpoint(where: str | os.PathLike[str]) -> CheckpointHeader | None:
    """Headers of every weight file of a checkpoint directory; None when it
    has no safetensors file."""
    directory = Path(where)
    index = directory / INDEX
    files: list[Path]
    if index.is_file():
        try:
            data = json.loads(index.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise InputError(
                f"malformed JSON: {exc.msg}", Position(str(index), exc.lineno, exc.colno)
            ) from None
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(f"cannot read {index}: {exc}") from None
        weight_map = data.get("weight_map") if isinstance(data, dict) else None
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise InputError(
                "expected an object mapping tensor names to shard files",
                Position(str(index), json_path="$.weight_map"),
            )
        files = [directory / name for name in sorted(set(weight_map.values()))]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise InputError(
                f"shards named in the index are missing: {', '.join(missing)}",
                Position(str(index), json_path="$.weight_map"),
            )
    else:
        files = sorted(directory.glob("*.safetensors"))
    if not files:
        return None
    header = CheckpointHeader(str(directory), tuple(f.name for f in files))
    for path in files:
        tensors, metadata = read_safetensors_header(path)
        header.tensors.update(tensors)
        if metadata and not header.metadata:
            header.metadata = dict(metadata)
    header.tensors = dict(sorted(header.tensors.items()))
    return header


def pattern(name: str) -> str:
    """``model.layers.3.mlp.experts.7.up_proj.weight`` -> ``model.layers.*.mlp.experts.*.up_proj.weight``."""
    return _LAYER_INDEX.sub(".*.", _LAYER_INDEX.sub(".*.", name))


def layer_count(header: CheckpointHeader) -> int | None:
    """Number of distinct indices after the first numbered path component."""
    indices = set()
    prefixes: Counter[str] = Counter()
    for name in header.tensors:
        match = _LAYER_INDEX.search(name)
        if match:
            prefixes[name[: match.start()]] += 1
    if not prefixes:
        return None
    prefix = prefixes.most_common(1)[0][0]
    for name in header.tensors:
        if name.startswith(prefix + "."):
            rest = name[len(prefix) + 1 :]
            head = rest.split(".", 1)[0]
            if head.isdigit():
                indices.add(int(head))
    return max(indices) + 1 if indices else None


def checkpoint_findings(header: CheckpointHeader, dims: dict[str, Any]) -> list[Finding]:
    """Facts from key names and shapes alone (the code cross-check adds the
    exact module names)."""
    tensors = header.tensors
    evidence = f"{len(tensors)} tensors in {len(header.files)} file(s); dtypes {header.dtypes}"
    out = [
        known(len(tensors), "checkpoint.tensors", CHECKPOINT, evidence),
        known(header.parameter_count, "checkpoint.parameters", CHECKPOINT, "sum of the header shapes"),
    ]
    layers = layer_count(header)
    if layers is not None:
        out.append(known(layers, "num_layers", CHECKPOINT, f"layer indices 0..{layers - 1} in the key names"))
    bias_patterns = sorted({pattern(n).rsplit(".", 1)[0] for n in tensors if n.endswith(".bias")})
    evidence = f"{len(bias_patterns)} module(s) with a stored bias"
    out.append(known(bias_patterns, "checkpoint.bias_modules", CHECKPOINT, evidence))
    out += _lm_head_stored(tensors, dims)
    out += _fused_qkv(tensors, dims)
    out += _fused_gate_up(tensors, dims)
    out += _expert_layout(tensors)
    out += _quantized(tensors)
    out += _float_dtype(tensors)
    return out


def _lm_head_stored(tensors: dict[str, TensorInfo], dims: dict[str, Any]) -> list[Finding]:
    """Two vocabulary matrices: the head is stored; one: it reuses the embedding."""
    hidden, vocab = dims.get("hidden_size"), dims.get("vocab_size")
    if not isinstance(hidden, int) or not isinstance(vocab, int):
        return []
    vocab_mats = sorted(n for n, t in tensors.items() if t.shape in ((vocab, hidden), (hidden, vocab)))
    if len(vocab_mats) >= 2:
        evidence = f"two vocabulary matrices: {', '.join(vocab_mats)}"
        return [known(True, "checkpoint.lm_head_stored", CHECKPOINT, evidence)]
    if len(vocab_mats) == 1:
        evidence = f"one vocabulary matrix ({vocab_mats[0]}): the head reuses the embedding"
        return [known(False, "checkpoint.lm_head_stored", CHECKPOINT, evidence)]
    return []


def _other_widths(dims: dict[str, Any]) -> set[int]:
    """Widths of other matrices: a fused width equal to one proves nothing."""
    sizes = ("hidden_size", "vocab_size", "intermediate_size", "moe_intermediate_size")
    return {w for w in (dims.get(size) for size in sizes) if isinstance(w, int)}


def _fused_qkv(tensors: dict[str, TensorInfo], dims: dict[str, Any]) -> list[Finding]:
    """A fused QKV projection by its width, where no other matrix has it."""
    hidden, inter = dims.get("hidden_size"), dims.get("intermediate_size")
    nh, nkv, hd = dims.get("num_heads"), dims.get("num_kv_heads"), dims.get("head_dim")
    if not (isinstance(hidden, int) and isinstance(nh, int) and isinstance(nkv, int) and isinstance(hd, int)):
        return []
    fused = (nh + 2 * nkv) * hd
    if fused in _other_widths(dims) or (isinstance(inter, int) and fused == 2 * inter):
        return []
    fused_keys = sorted(
        {pattern(n) for n, t in tensors.items() if t.shape in ((fused, hidden), (hidden, fused))}
    )
    if fused_keys:
        evidence = f"{fused_keys[0]}: width {fused} = (heads + 2 kv heads) x head_dim"
        return [known(True, "checkpoint.fused_qkv", CHECKPOINT, evidence)]
    evidence = f"no tensor of width {fused} = (heads + 2 kv heads) x head_dim"
    return [known(False, "checkpoint.fused_qkv", CHECKPOINT, evidence, confidence=INFERRED)]


def _fused_gate_up(tensors: dict[str, TensorInfo], dims: dict[str, Any]) -> list[Finding]:
    """A fused gate/up projection (dense or expert) by its width, twice the intermediate size."""
    hidden, widths = dims.get("hidden_size"), _other_widths(dims)
    for label, size in (
        ("intermediate", dims.get("intermediate_size")),
        ("expert intermediate", dims.get("moe_intermediate_size")),
    ):
        if isinstance(size, int) and isinstance(hidden, int) and 2 * size not in widths:
            gate_up = sorted(
                {
                    pattern(n)
                    for n, t in tensors.items()
                    if len(t.shape) >= 2 and 2 * size in t.shape[-2:] and hidden in t.shape[-2:]
                }
            )
            if gate_up:
                evidence = f"{gate_up[0]}: width 2 x {label} {size}"
                return [known(True, "checkpoint.fused_gate_up", CHECKPOINT, evidence)]
    return []


def _expert_layout(tensors: dict[str, TensorInfo]) -> list[Finding]:
    """One key per expert, or 3-D tensors holding every expert."""
    per_expert = sorted({pattern(n) for n in tensors if re.search(r"experts\.\d+\.", n)})
    if per_expert:
        evidence = f"{per_expert[0]} (one key per expert)"
        return [known("per_expert", "checkpoint.expert_layout", CHECKPOINT, evidence)]
    stacked = sorted({pattern(n) for n, t in tensors.items() if "expert" in n and len(t.shape) == 3})
    if stacked:
        return [known("stacked", "checkpoint.expert_layout", CHECKPOINT, f"{stacked[0]} (3-D, all experts)")]
    return []


def _quantized(tensors: dict[str, TensorInfo]) -> list[Finding]:
    """Quantized dtypes or scale/block tensors."""
    quant = sorted(
        {t.dtype for t in tensors.values() if t.dtype in ("U8", "I8", "F8_E4M3", "F8_E5M2", "F4", "I32")}
    )
    scales = [n for n in tensors if n.endswith(("_scales", "_blocks", "weight_scale", "qweight", "scales"))]
    if not quant and not scales:
        return []
    evidence = f"dtypes {quant or '-'}; {len(scales)} scale/block tensors"
    return [known(True, "checkpoint.quantized", CHECKPOINT, evidence)]


def _float_dtype(tensors: dict[str, TensorInfo]) -> list[Finding]:
    """The most common floating dtype."""
    floats = Counter(t.dtype for t in tensors.values() if t.dtype in ("F32", "F16", "BF16", "F64"))
    if not floats:
        return []
    return [
        known(floats.most_common(1)[0][0], "checkpoint.dtype", CHECKPOINT, f"dtype counts {dict(floats)}")
    ]
