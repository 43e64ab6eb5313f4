"""Two-rank runs of the stand-in's parallel attention kernels (spawned by
``test_parallel_kernels``): attention data parallelism and decode context
parallelism in ``attention_decode``, and ``segmented_attention_cp``. Each
rank saves what it computed; the test compares the ranks' results with one
process computing the same attention unsplit."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from autoport_cst.transform.edit.kernels import DECODE_UNFUSED
from autoport_cst.validate.standin import functional as NF
from autoport_cst.validate.standin.parallel_state import GroupCoordinator

D, BLOCK, BLOCKS_PER_SEQ = 8, 4, 32  # a decode context of 128 slots
HIDDEN, HEADS = 16, 4


def case(seed: int = 0) -> dict[str, torch.Tensor]:
    """The same random tensors on every rank and in the parent."""
    generator = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=generator)

    return {
        "w_q": randn(HIDDEN, HEADS * D) * 0.5,
        "w_kv": randn(HIDDEN, 2 * D) * 0.5,  # one KV head
        "x": randn(2, 1, HIDDEN),
        "k_cache": randn(2 * BLOCKS_PER_SEQ + 2, 1, BLOCK, D),
        "v_cache": randn(2 * BLOCKS_PER_SEQ + 2, 1, BLOCK, D),
        "q_chunk": randn(HEADS, 4, D),
        "k_seq": randn(1, 8, D),
        "v_seq": randn(1, 8, D),
    }


def tables() -> torch.Tensor:
    return torch.arange(1, 2 * BLOCKS_PER_SEQ + 1, dtype=torch.int32).reshape(2, BLOCKS_PER_SEQ)


POSITIONS = (5, 9)


def decode_mask(positions: list[int], q_heads: int, **dcp) -> torch.Tensor:
    return NF.gen_attention_decode_mask(
        torch.tensor([positions], dtype=torch.float32),
        len(positions),
        q_heads,
        1,
        BLOCKS_PER_SEQ * BLOCK,
        block_len=BLOCK,
        **dcp,
    )


def attention_dp(rank: int, tensors: dict, group) -> torch.Tensor:
    """Rank ``rank`` holds sequence ``rank``'s cache and Q heads
    ``[2 rank, 2 rank + 2)``; returns its partial output summed over ranks."""
    heads = slice(2 * rank * D, (2 * rank + 2) * D)
    w_qkv = torch.cat((tensors["w_q"][:, heads], tensors["w_kv"]), dim=1)
    output = NF.attention_decode(
        X=tensors["x"],
        W_qkv=w_qkv,
        K_cache=tensors["k_cache"],
        V_cache=tensors["v_cache"],
        active_blocks_table=tables()[rank : rank + 1],
        attention_mask=decode_mask([POSITIONS[rank]], HEADS),
        W_out=torch.eye(HEADS * D)[heads],
        attention_dp=2,
        attention_dp_group=group,
        attention_dp_rank=rank,
    )[0]
    dist.all_reduce(output, group=group)
    return output  # [2, HEADS * D]: each sequence's attention of every head


def op_by_op_decode():
    """The ports' op-by-op decode attention, as the codemods write it."""
    namespace = {"torch": torch, "NF": NF}
    exec(DECODE_UNFUSED, namespace)
    return namespace["_attention_decode_unfused"]


def context_parallel_decode(
    rank: int, tensors: dict, coordinator: GroupCoordinator, kernel=NF.attention_decode
) -> torch.Tensor:
    """Sequence 1 (position 9) with its context interleaved over two ranks
    (interleave 1): rank ``r`` holds positions ``p % 2 == r`` in order."""
    position = POSITIONS[1]
    full_k = tensors["k_cache"][tables()[1].long(), 0].reshape(-1, D)
    full_v = tensors["v_cache"][tables()[1].long(), 0].reshape(-1, D)
    local_k, local_v = torch.zeros_like(full_k), torch.zeros_like(full_v)
    owned = list(range(rank, position, 2))
    local_k[: len(owned)], local_v[: len(owned)] = full_k[owned], full_v[owned]
    k_cache = local_k.reshape(BLOCKS_PER_SEQ, 1, BLOCK, D)
    v_cache = local_v.reshape(BLOCKS_PER_SEQ, 1, BLOCK, D)
    heads = slice(2 * rank * D, (2 * rank + 2) * D)
    w_qkv = torch.cat((tensors["w_q"][:, heads], tensors["w_kv"]), dim=1)
    mask = decode_mask(
        [position],
        HEADS,
        local_filled_slots=torch.tensor([float(len(owned))]),
        dcp_active_mask=torch.tensor([1.0 if position % 2 == rank else 0.0]),
    )
    output = kernel(
        X=tensors["x"][1:],
        W_qkv=w_qkv,
        K_cache=k_cache,
        V_cache=v_cache,
        active_blocks_table=torch.arange(BLOCKS_PER_SEQ, dtype=torch.int32).reshape(1, -1),
        attention_mask=mask,
        dcp_size=2,
        dcp_group=coordinator,
    )[0]
    return output  # [1, 2 local heads, D, 1]


def segmented_cp(rank: int, tensors: dict, coordinator: GroupCoordinator) -> torch.Tensor:
    """Four cached tokens then a chunk of four, interleave 1: rank ``r``
    caches positions ``0..3`` with ``p % 2 == r`` and holds the chunk's."""
    k_seq, v_seq = tensors["k_seq"], tensors["v_seq"]
    cached = [p for p in range(4) if p % 2 == rank]
    current = [p for p in range(4, 8) if p % 2 == rank]
    k_cache = torch.zeros(2, 1, BLOCK, D)
    v_cache = torch.zeros(2, 1, BLOCK, D)
    k_cache[1, 0, : len(cached)] = k_seq[0, cached]
    v_cache[1, 0, : len(cached)] = v_seq[0, cached]
    return NF.segmented_attention_cp(
        q=tensors["q_chunk"],
        k_local=k_seq[:, current],
        v_local=v_seq[:, current],
        k_cache=k_cache,
        v_cache=v_cache,
        block_tables=torch.tensor([[1]], dtype=torch.int32),
        prior_tokens=torch.tensor([[len(cached)]], dtype=torch.int32),
        block_size=BLOCK,
        cp_rank=rank,
        cp_world_size=2,
        cp_kv_cache_interleave_size=1,
        cp_group=coordinator,
        scale=0.4,
        tp_q=True,
        tp_out=False,
    )  # [HEADS, 2, D]: chunk queries [2 rank, 2 rank + 2)


def run(rank: int, port: int, directory: str) -> None:
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2, timeout=timedelta(seconds=120)
    )
    try:
        torch.set_num_threads(1)
        tensors = case()
        coordinator = GroupCoordinator(dist.group.WORLD, name="dcp")
        results = {
            "attention_dp": attention_dp(rank, tensors, dist.group.WORLD),
            "dcp": context_parallel_decode(rank, tensors, coordinator),
            "dcp_op_by_op": context_parallel_decode(rank, tensors, coordinator, op_by_op_decode()),
            "segmented_cp": segmented_cp(rank, tensors, coordinator),
        }
        torch.save(results, Path(directory) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()
