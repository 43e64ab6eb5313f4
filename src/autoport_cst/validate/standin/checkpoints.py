"""Stand-in for ``vllm_neuron.utils.checkpoints``: read a local safetensors
checkpoint into a model's parameters, one TP rank's shard at a time.

For every parameter of ``model.named_parameters()`` the checkpoint key(s) are
``mappings.get(name, name)`` (a string, or a list for fused tensors). The
parameter's weight loader turns the slices into this rank's tensor, whose shape
must equal the parameter's.

Errors name what failed: ``CheckpointKeyError`` (strict mode, a mapped key is
absent: the parameter and the key) and ``CheckpointShapeError`` (the loaded
shard does not have the parameter's shape: the parameter, the key(s) with their
checkpoint shapes, and both shapes).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, NamedTuple

import torch
from safetensors import safe_open

from .weight_loader import get_weight_loader


class CheckpointLoadResult(NamedTuple):
    state_dict: dict[str, torch.Tensor]
    missing_keys: list[str]
    unexpected_keys: list[str]


class CheckpointError(RuntimeError):
    """A checkpoint cannot provide what the model needs."""

    def __init__(self, message: str, parameter: str, keys: list[str]) -> None:
        super().__init__(message)
        self.parameter = parameter
        self.keys = keys


class CheckpointKeyError(CheckpointError):
    """A key the mappings name is not in the checkpoint."""


class CheckpointShapeError(CheckpointError):
    """A loaded tensor does not have its parameter's shape."""


class SafetensorsCheckpoint:
    """A local directory of ``*.safetensors`` files (with or without
    ``model.safetensors.index.json``)."""

    def __init__(self, model_name_or_path: str | os.PathLike[str], cache_dir: str | None = None):
        self._root = Path(model_name_or_path)
        if not self._root.is_dir():
            raise FileNotFoundError(
                f"{self._root}: not a local checkpoint directory "
                "(the CPU stand-in reads local safetensors checkpoints only)"
            )
        self._tensor_name_to_file: dict[str, Path] = {}
        self._files: dict[Path, Any] = {}
        self._indexed = False

    # -- index -------------------------------------------------------------

    def _ensure_indexed(self) -> None:
        if self._indexed:
            return
        index_path = self._root / "model.safetensors.index.json"
        if index_path.is_file():
            weight_map = json.loads(index_path.read_text(encoding="utf-8")).get("weight_map")
            if not isinstance(weight_map, dict) or not weight_map:
                raise ValueError(f"{index_path}: no weight_map")
            for name, file_name in weight_map.items():
                path = self._root / file_name
                if Path(file_name).name != file_name or not path.is_file():
                    raise FileNotFoundError(f"{index_path}: {name!r} points to missing file {file_name!r}")
                self._tensor_name_to_file[name] = path
        else:
            files = sorted(self._root.glob("*.safetensors"))
            if not files:
                raise FileNotFoundError(f"{self._root}: no .safetensors files")
            for path in files:
                for name in self._open(path).keys():
                    self._tensor_name_to_file[name] = path
        self._indexed = True

    def _open(self, path: Path) -> Any:
        handle = self._files.get(path)
        if handle is None:
            handle = safe_open(str(path), framework="pt", device="cpu")
            self._files[path] = handle
        return handle

    def get_tensor_names(self) -> list[str]:
        self._ensure_indexed()
        return sorted(self._tensor_name_to_file)

    def _get_slice(self, name: str) -> Any:
        self._ensure_indexed()
        return self._open(self._tensor_name_to_file[name]).get_slice(name)

    # -- loading -----------------------------------------------------------

    def load_sharded(
        self,
        rank: int,
        world_size: int,
        model: torch.nn.Module,
        mappings: dict[str, str | list[str]],
        device: Any = "cpu",
        strict: bool = True,
        dtype_override: dict[str, torch.dtype] | None = None,
        cast_to_parameter_dtype: bool = False,
    ) -> CheckpointLoadResult:
        """Load this rank's shard of every parameter, sequentially."""
        self._ensure_indexed()
        state: dict[str, torch.Tensor] = {}
        missing: list[str] = []
        referenced: set[str] = set()
        for name, param in model.named_parameters():
            keys = mappings.get(name, name)
            keys = list(keys) if isinstance(keys, (list, tuple)) else [keys]
            referenced.update(keys)
            absent = [key for key in keys if key not in self._tensor_name_to_file]
            if absent:
                if strict:
                    raise CheckpointKeyError(
                        f"checkpoint {self._root} has no tensor {', '.join(map(repr, absent))} "
                        f"for parameter '{name}'",
                        parameter=name,
                        keys=absent,
                    )
                missing.append(name)
                continue
            slices = [self._get_slice(key) for key in keys]
            try:
                tensor = get_weight_loader(param).load(slices, rank)
            except (ValueError, AssertionError, IndexError, RuntimeError) as error:
                raise CheckpointShapeError(
                    f"loading parameter '{name}' from {self._describe(keys, slices)} failed: {error}",
                    parameter=name,
                    keys=keys,
                ) from error
            if tuple(tensor.shape) != tuple(param.shape):
                raise CheckpointShapeError(
                    f"parameter '{name}' has shape {list(param.shape)} on rank {rank} of "
                    f"{world_size}, but loading {self._describe(keys, slices)} gives "
                    f"{list(tensor.shape)}",
                    parameter=name,
                    keys=keys,
                )
            target = (dtype_override or {}).get(name)
            if target is None and cast_to_parameter_dtype:
                target = param.dtype
            if target is not None and tensor.dtype != target:
                tensor = tensor.to(target)
            state[name] = tensor.to(device)
        unexpected = sorted(set(self._tensor_name_to_file) - referenced)
        return CheckpointLoadResult(state, missing, unexpected)

    def load_sharded_pipelined(
        self,
        rank: int,
        world_size: int,
        model: torch.nn.Module,
        mappings: dict[str, str | list[str]],
        device: Any = "cpu",
        dtype_override: dict[str, torch.dtype] | None = None,
        strict: bool = True,
    ) -> CheckpointLoadResult:
        """As the serving engine loads: tensors are cast to the parameter's
        dtype (or ``dtype_override[name]``). Runs sequentially on CPU."""
        return self.load_sharded(
            rank,
            world_size,
            model,
            mappings,
            device,
            strict=strict,
            dtype_override=dtype_override,
            cast_to_parameter_dtype=True,
        )

    @staticmethod
    def _describe(keys: list[str], slices: list[Any]) -> str:
        return ", ".join(f"'{key}' {list(s.get_shape())}" for key, s in zip(keys, slices, strict=False))
