"""Stand-in for ``vllm_neuron.utils.weight_loader``.

A parameter carries a ``SafetensorsWeightLoader`` (attribute
``weight_loader``) whose transform turns the checkpoint slices of its mapped
key(s) into this rank's tensor: ``transform(slices, rank) -> Tensor``. A slice
is anything with ``get_shape()`` and ``__getitem__`` (a safetensors
``PySafeSlice`` or ``TensorSlice`` over an in-memory tensor).

Linear weights are stored transposed relative to the checkpoint
(``is_storage_transposed=True``: the checkpoint is ``[out, in]``, the
parameter ``[in, out]``), and ``shard_dim`` always names a dimension of the
parameter.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

_ATTRIBUTE = "weight_loader"

Transform = Callable[[Sequence[Any], int], torch.Tensor]


class TensorSlice:
    """A ``PySafeSlice``-like view of an in-memory tensor (for tests and
    loaders that build tensors themselves)."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self._tensor = tensor

    def get_shape(self) -> list[int]:
        return list(self._tensor.shape)

    def get_dtype(self) -> str:
        return str(self._tensor.dtype).replace("torch.", "")

    def __getitem__(self, index: Any) -> torch.Tensor:
        return self._tensor[index]


@dataclass
class SafetensorsWeightLoader:
    """How one parameter is read: ``transform(slices, rank)``, or the single
    mapped tensor as it is when ``transform`` is None."""

    transform: Transform | None = None

    def load(self, slices: Sequence[Any], rank: int) -> torch.Tensor:
        if self.transform is not None:
            result = self.transform(slices, rank)
        else:
            if len(slices) != 1:
                raise ValueError(
                    f"a loader without a transform takes exactly one checkpoint tensor, got {len(slices)}"
                )
            result = slices[0][:]
        return result.contiguous()


def set_weight_loader(param: torch.nn.Parameter, loader: SafetensorsWeightLoader) -> None:
    setattr(param, _ATTRIBUTE, loader)


def get_weight_loader(param: torch.nn.Parameter) -> SafetensorsWeightLoader:
    return getattr(param, _ATTRIBUTE, None) or SafetensorsWeightLoader()


def with_rank_override(loader: SafetensorsWeightLoader, rank: int) -> SafetensorsWeightLoader:
    """Load with a fixed ``rank`` whatever rank the checkpoint reader passes."""
    return SafetensorsWeightLoader(transform=lambda slices, _rank: loader.load(slices, rank))


def pad_to_shape(tensor: torch.Tensor, shape: Sequence[int], value: float = 0.0) -> torch.Tensor:
    """Zero-pad (or ``value``-pad) ``tensor`` at the end of each dimension."""
    if len(shape) != tensor.dim():
        raise ValueError(f"pad_to_shape: rank mismatch {tuple(tensor.shape)} -> {tuple(shape)}")
    padding: list[int] = []
    for current, target in zip(reversed(tensor.shape), reversed(list(shape)), strict=False):
        if target < current:
            raise ValueError(f"pad_to_shape: cannot shrink {tuple(tensor.shape)} to {tuple(shape)}")
        padding += [0, target - current]
    if not any(padding):
        return tensor
    return F.pad(tensor, padding, value=value)


def get_shard(tensor: torch.Tensor, dim: int, shard_size: int, rank: int) -> torch.Tensor:
    """Rows ``[rank * shard_size, (rank + 1) * shard_size)`` of ``dim``."""
    return tensor.narrow(dim, rank * shard_size, min(shard_size, tensor.shape[dim] - rank * shard_size))


def _storage_dim(shard_dim: int, is_storage_transposed: bool) -> int:
    if is_storage_transposed and shard_dim in (0, 1):
        return 1 - shard_dim
    return shard_dim


def _read_shard(slice_obj: Any, storage_dim: int, start: int, size: int) -> torch.Tensor:
    shape = slice_obj.get_shape()
    index = [slice(None)] * len(shape)
    index[storage_dim] = slice(start, start + size)
    return slice_obj[tuple(index)]


def sharding_weight_loader(
    shard_dim: int,
    shard_size: int,
    num_shards: int,
    is_storage_transposed: bool = False,
    pad_shard: bool = False,
) -> SafetensorsWeightLoader:
    """This rank's ``shard_size`` rows of parameter dimension ``shard_dim``;
    with ``pad_shard`` a short last shard is zero-padded to ``shard_size``."""

    def transform(slices: Sequence[Any], rank: int) -> torch.Tensor:
        if len(slices) != 1:
            raise ValueError(f"sharding_weight_loader takes one checkpoint tensor, got {len(slices)}")
        source = slices[0]
        if is_storage_transposed and len(source.get_shape()) > 2:
            raise ValueError("sharding_weight_loader: transposed storage needs a 2-D tensor")
        storage_dim = _storage_dim(shard_dim, is_storage_transposed)
        result = _read_shard(source, storage_dim, (rank % num_shards) * shard_size, shard_size)
        if is_storage_transposed:
            result = result.T
        if pad_shard:
            target = list(result.shape)
            target[shard_dim] = shard_size
            result = pad_to_shape(result, target)
        return result

    return SafetensorsWeightLoader(transform=transform)


def sharding_weight_loader_with_padding(
    shard_dim: int,
    shard_size: int,
    num_shards: int,
    is_storage_transposed: bool = False,
    pad_dim: int | None = None,
    padded_size: int | None = None,
    unpadded_size: int | None = None,
) -> SafetensorsWeightLoader:
    """``sharding_weight_loader``, then zero-pad ``pad_dim`` by
    ``padded_size - unpadded_size``."""
    base = sharding_weight_loader(shard_dim, shard_size, num_shards, is_storage_transposed)

    def transform(slices: Sequence[Any], rank: int) -> torch.Tensor:
        result = base.load(slices, rank)
        if pad_dim is not None and padded_size and unpadded_size and padded_size != unpadded_size:
            target = list(result.shape)
            target[pad_dim] += padded_size - unpadded_size
            result = pad_to_shape(result, target)
        return result

    return SafetensorsWeightLoader(transform=transform)


def fused_qkv_weight_loader(
    q_size: int,
    kv_size: int,
    shard_dim: int,
    num_shards: int,
    is_storage_transposed: bool = False,
    num_kv_replicas: int = 1,
    padded_hidden_size: int | None = None,
    unpadded_hidden_size: int | None = None,
    attention_dp_rank: int = 0,
    attention_dp_size: int = 1,
    kv_sharded_across_attention_dp: bool = False,
) -> SafetensorsWeightLoader:
    """Fuse separate Q, K, V checkpoint tensors into this rank's ``q|k|v``.

    Q rows ``[q_rank * q_size, +q_size)``; K and V rows
    ``[kv_rank * kv_size, +kv_size)`` with ``kv_rank = rank // num_kv_replicas``
    (several ranks share a KV head when TP exceeds the KV head count). With
    attention data parallelism the Q heads are sharded over TP x DP ranks:
    ``q_rank = attention_dp_rank + rank * attention_dp_size``; the K/V heads
    too when ``kv_sharded_across_attention_dp`` (then ``kv_rank = q_rank``).
    """

    def transform(slices: Sequence[Any], rank: int) -> torch.Tensor:
        if len(slices) != 3:
            raise ValueError(f"fused_qkv_weight_loader takes 3 tensors (q, k, v), got {len(slices)}")
        for name, source in zip("qkv", slices, strict=False):
            if len(source.get_shape()) != 2:
                raise ValueError(
                    f"fused_qkv_weight_loader: the {name} tensor must be 2-D, got shape {source.get_shape()}"
                )
        tp_rank = rank % num_shards
        q_rank = attention_dp_rank + tp_rank * attention_dp_size
        kv_rank = q_rank if kv_sharded_across_attention_dp else tp_rank // num_kv_replicas
        storage_dim = _storage_dim(shard_dim, is_storage_transposed)
        parts = [
            _read_shard(slices[0], storage_dim, q_rank * q_size, q_size),
            _read_shard(slices[1], storage_dim, kv_rank * kv_size, kv_size),
            _read_shard(slices[2], storage_dim, kv_rank * kv_size, kv_size),
        ]
        if is_storage_transposed:
            parts = [part.T for part in parts]
        fused = torch.cat(parts, dim=shard_dim)
        if padded_hidden_size and unpadded_hidden_size and padded_hidden_size != unpadded_hidden_size:
            hidden_dim = 1 - shard_dim
            target = list(fused.shape)
            target[hidden_dim] = padded_hidden_size
            fused = pad_to_shape(fused, target)
        return fused

    return SafetensorsWeightLoader(transform=transform)


def last_dim_padding_weight_loader(padded_size: int) -> SafetensorsWeightLoader:
    """The whole tensor, zero-padded at the end of its last dimension."""

    def transform(slices: Sequence[Any], rank: int) -> torch.Tensor:
        if len(slices) != 1:
            raise ValueError(f"last_dim_padding_weight_loader takes one tensor, got {len(slices)}")
        tensor = slices[0][:]
        target = list(tensor.shape)
        target[-1] = padded_size
        return pad_to_shape(tensor, target)

    return SafetensorsWeightLoader(transform=transform)


def scaled_bias_loader(scale: float, padded_size: int | None = None) -> SafetensorsWeightLoader:
    """The whole bias divided by ``scale`` (a bias added before a sum over
    ``scale`` ranks), optionally zero-padded to ``padded_size``."""

    def transform(slices: Sequence[Any], rank: int) -> torch.Tensor:
        if len(slices) != 1:
            raise ValueError(f"scaled_bias_loader takes one tensor, got {len(slices)}")
        tensor = slices[0][:]
        result = tensor / scale
        if padded_size is not None:
            target = list(result.shape)
            target[-1] = padded_size
            result = pad_to_shape(result, target)
        return result.to(tensor.dtype)

    return SafetensorsWeightLoader(transform=transform)


# -- expert parallelism ----------------------------------------------------------
#
# An EP rank holds a contiguous range of experts. These wrappers restrict the
# INPUT of the inner loader (built for the local expert count) to that range
# before it runs; they differ in how the experts are laid out in the slices.


def _contiguous_range(local_expert_indices: Sequence[int]) -> tuple[int, int]:
    """``(first, last + 1)`` of a contiguous, increasing expert list."""
    indices = list(local_expert_indices)
    if not indices or indices != list(range(indices[0], indices[0] + len(indices))):
        raise ValueError(f"local expert indices must be a contiguous increasing range, got {indices}")
    return indices[0], indices[-1] + 1


def _inner_transform(original_loader: SafetensorsWeightLoader, wrapper: str) -> Transform:
    if original_loader.transform is None:
        raise ValueError(f"{wrapper}: the wrapped loader must have a transform")
    return original_loader.transform


def expert_parallel_tensor_dim_loader(
    local_expert_indices: Sequence[int],
    original_loader: SafetensorsWeightLoader,
    expert_dim: int = 0,
) -> SafetensorsWeightLoader:
    """Each checkpoint tensor holds every expert on ``expert_dim`` (GPT-OSS's
    ``[E, ...]``): the inner loader sees each restricted to this rank's
    experts."""
    start, stop = _contiguous_range(local_expert_indices)
    inner = _inner_transform(original_loader, "expert_parallel_tensor_dim_loader")

    def transform(slices: Sequence[Any], rank: int) -> torch.Tensor:
        local = [TensorSlice(_read_shard(s, expert_dim, start, stop - start)) for s in slices]
        return inner(local, rank)

    return SafetensorsWeightLoader(transform=transform)


def _items_per_expert(slices: Sequence[Any], total_num_experts: int, wrapper: str) -> int:
    if total_num_experts <= 0 or len(slices) % total_num_experts != 0:
        raise ValueError(
            f"{wrapper}: {len(slices)} checkpoint tensors do not divide into {total_num_experts} experts"
        )
    return len(slices) // total_num_experts


def expert_parallel_grouped_loader(
    local_expert_indices: Sequence[int],
    original_loader: SafetensorsWeightLoader,
    total_num_experts: int,
) -> SafetensorsWeightLoader:
    """One tensor per expert, grouped by item: ``[gate_0 .. gate_{E-1},
    up_0 .. up_{E-1}]`` (Qwen3-MoE); the inner loader sees this rank's
    experts of every group."""
    start, stop = _contiguous_range(local_expert_indices)
    inner = _inner_transform(original_loader, "expert_parallel_grouped_loader")

    def transform(slices: Sequence[Any], rank: int) -> torch.Tensor:
        groups = _items_per_expert(slices, total_num_experts, "expert_parallel_grouped_loader")
        local: list[Any] = []
        for group in range(groups):
            base = group * total_num_experts
            local.extend(slices[base + start : base + stop])
        return inner(local, rank)

    return SafetensorsWeightLoader(transform=transform)


def expert_parallel_interleaved_loader(
    local_expert_indices: Sequence[int],
    original_loader: SafetensorsWeightLoader,
    total_num_experts: int,
) -> SafetensorsWeightLoader:
    """Tensors interleaved by expert: ``[gate_0, up_0, gate_1, up_1, ...]``;
    the inner loader sees this rank's experts' consecutive items."""
    start, stop = _contiguous_range(local_expert_indices)
    inner = _inner_transform(original_loader, "expert_parallel_interleaved_loader")

    def transform(slices: Sequence[Any], rank: int) -> torch.Tensor:
        items = _items_per_expert(slices, total_num_experts, "expert_parallel_interleaved_loader")
        return inner(list(slices[start * items : stop * items]), rank)

    return SafetensorsWeightLoader(transform=transform)
