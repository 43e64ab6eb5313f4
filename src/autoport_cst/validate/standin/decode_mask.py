"""Stand-in for ``vllm_neuron.functional.attention.attention_decode_mask``:
the decode attention mask and the block-length resize rule of the decode
kernel.

The mask is ``[s_prior, bs, q_head, s_active]`` with values in {0, 1} over a
sequence's gathered context of ``s_prior`` slots, whose last ``s_active``
slots hold the step's active tokens. The stand-in uses the plain layout
(slot ``s`` is context position ``s``); the device kernel tile-shuffles the
slot order, an implementation detail that the stand-in's own decode
attention does not need.

- Regular decode: a prior slot ``s`` of sequence ``b`` is visible when
  ``s < min(pos_ids[b])`` (the cache holds the tokens before the first
  active one) and, with a sliding window, ``s >= max(start_pos[b])``; the
  active slots are causal among themselves.
- Decode context parallelism (``local_filled_slots`` given): each rank holds
  an interleaved share of the context, so prior slot ``s`` is visible when
  ``s < local_filled_slots[b]``, and the active slots are visible on the rank
  that owns the active token (``dcp_active_mask[b]`` = 1).

``block_len`` decides the device layout of the mask, which must be the one
``attention_decode`` reads for its cache: each mask remembers the
``block_len`` it was built for (``mask_block_len``, for the mask and its
views), and ``attention_decode`` refuses a mask built for blocks of another
length than its cache's.
"""

from __future__ import annotations

import math
import weakref

import torch

from . import kernel_phases
from .kernel_options import refuse_bools
from .numerics import P_MAX, KernelConstraintError

LOGICAL_CORES = 2  # the decode kernel shards over two logical cores
_BUILT: list[tuple[weakref.ref, int]] = []  # live masks and the block_len each was built for


def _remember(mask: torch.Tensor, block_len: int) -> torch.Tensor:
    _BUILT[:] = [(ref, length) for ref, length in _BUILT if ref() is not None]
    _BUILT.append((weakref.ref(mask), block_len))
    return mask


def mask_block_len(tensor: torch.Tensor) -> int | None:
    """The ``block_len`` of the ``gen_attention_decode_mask`` mask ``tensor``
    is (or views); None for a tensor that is not one."""
    storage = tensor.untyped_storage().data_ptr()
    for ref, length in reversed(_BUILT):
        mask = ref()
        if mask is not None and mask.untyped_storage().data_ptr() == storage:
            return length
    return None


def gen_attention_decode_mask(
    pos_ids: torch.Tensor,
    bs: int,
    q_head: int,
    s_active: int,
    s_prior: int,
    start_pos: torch.Tensor | None = None,
    block_len: int = 0,
    local_filled_slots: torch.Tensor | None = None,
    dcp_active_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """The decode mask (module docstring); ``pos_ids [1, bs * s_active]``."""
    kernel_phases.record("gen_attention_decode_mask")
    refuse_bools(
        "gen_attention_decode_mask",
        bs=bs,
        q_head=q_head,
        s_active=s_active,
        s_prior=s_prior,
        block_len=block_len,
    )
    if s_prior % P_MAX != 0:
        raise KernelConstraintError(f"s_prior ({s_prior}) must be divisible by {P_MAX}")
    if local_filled_slots is not None:
        mask = _context_parallel_mask(local_filled_slots, dcp_active_mask, bs, q_head, s_active, s_prior)
        return _remember(mask, block_len)
    if dcp_active_mask is not None:
        raise KernelConstraintError("gen_attention_decode_mask: dcp_active_mask needs local_filled_slots")
    positions = pos_ids.reshape(bs, s_active).to(torch.float32)
    first = positions.min(dim=1).values  # [bs]
    if bool((first > s_prior - s_active).any()):
        raise KernelConstraintError(
            f"gen_attention_decode_mask: position {int(first.max())} does not fit a context of "
            f"{s_prior} slots with {s_active} active token(s): allocate more blocks per sequence"
        )
    slots = torch.arange(s_prior, dtype=torch.float32, device=pos_ids.device).view(s_prior, 1)
    prior = slots < first.view(1, bs)  # [s_prior, bs]
    if start_pos is not None:
        start = start_pos.reshape(bs, s_active).to(torch.float32).max(dim=1).values
        prior = prior & (slots >= start.view(1, bs))
    mask = prior.view(s_prior, bs, 1).expand(s_prior, bs, s_active).clone()
    causal = torch.ones(s_active, s_active, dtype=torch.bool, device=pos_ids.device).triu()
    mask[s_prior - s_active :] = causal.view(s_active, 1, s_active).expand(s_active, bs, s_active)
    full = mask.to(torch.float32).unsqueeze(2).expand(s_prior, bs, q_head, s_active).contiguous()
    return _remember(full, block_len)


def _per_request(values: torch.Tensor, bs: int, name: str) -> torch.Tensor:
    """A scalar or ``[bs]`` / ``[1, bs]`` per-request value as ``[bs]``."""
    flat = values.to(torch.float32).reshape(-1)
    if flat.numel() == 1:
        return flat.expand(bs)
    if flat.numel() != bs:
        raise KernelConstraintError(
            f"gen_attention_decode_mask: {name} must be a scalar or [{bs}], got {list(values.shape)}"
        )
    return flat


def _context_parallel_mask(
    local_filled_slots: torch.Tensor,
    dcp_active_mask: torch.Tensor | None,
    bs: int,
    q_head: int,
    s_active: int,
    s_prior: int,
) -> torch.Tensor:
    filled = _per_request(local_filled_slots, bs, "local_filled_slots")
    slots = torch.arange(s_prior, dtype=torch.float32).view(s_prior, 1)
    prior = (slots < filled.view(1, bs)).to(torch.float32)
    active = (slots >= s_prior - s_active).to(torch.float32).expand(s_prior, bs)
    if dcp_active_mask is not None:
        active = active * _per_request(dcp_active_mask, bs, "dcp_active_mask").view(1, bs)
    mask = (prior + active).clamp(max=1.0)
    return mask.view(s_prior, bs, 1, 1).expand(s_prior, bs, q_head, s_active).contiguous()


def _resize_block_len(block_len: int, bs: int, q_head: int, s_active: int, s_prior: int) -> int:
    """The block length the decode kernel works with.

    The kernel loads ``P_MAX`` blocks per step on each of its shards, so the
    number of blocks per sequence must be a multiple of ``shards * P_MAX``;
    when it is not, the kernel splits blocks into smaller ones: the largest
    length dividing both ``block_len`` and ``context / (shards * P_MAX)``.
    The context is sharded (two shards) only when the batch is not: the
    batch shards when it is even and either large (``bs * q_head *
    s_active >= P_MAX``) or the context short (at most ``2 * P_MAX``).
    A context that no block length can satisfy keeps ``block_len``."""
    if block_len <= 0:
        return block_len
    batch_sharded = bs % LOGICAL_CORES == 0 and (bs * q_head * s_active >= P_MAX or s_prior <= 2 * P_MAX)
    shards = LOGICAL_CORES if (not batch_sharded and s_prior >= LOGICAL_CORES * P_MAX) else 1
    context = (s_prior // block_len) * block_len
    if context % (shards * P_MAX) != 0:
        return block_len
    return math.gcd(block_len, context // (shards * P_MAX))
