"""Attention data parallelism and decode context parallelism, split over two
ranks joined by gloo (``parallel_kernels``), give what one process computes
unsplit; so does the ports' op-by-op decode attention with decode context
parallelism."""

from __future__ import annotations

import socket
from pathlib import Path

import torch
import torch.multiprocessing as mp

from autoport_cst.validate.standin import functional as NF

from . import parallel_kernels as P
from .test_standin_kernels import naive_attention


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _unsplit_decode(tensors: dict) -> torch.Tensor:
    """Both sequences, every head, one process: ``[2, HEADS * D]``."""
    w_qkv = torch.cat((tensors["w_q"], tensors["w_kv"]), dim=1)
    return NF.attention_decode(
        X=tensors["x"],
        W_qkv=w_qkv,
        K_cache=tensors["k_cache"],
        V_cache=tensors["v_cache"],
        active_blocks_table=P.tables(),
        attention_mask=P.decode_mask(list(P.POSITIONS), P.HEADS),
        W_out=torch.eye(P.HEADS * P.D),
    )[0]


def _unsplit_chunk(tensors: dict) -> torch.Tensor:
    """Chunk queries at positions 4..7 over the whole sequence: ``[HEADS, 4, D]``."""
    visible = torch.arange(8)[None, :] <= torch.arange(4, 8)[:, None]
    k = tensors["k_seq"].expand(P.HEADS, -1, -1)
    v = tensors["v_seq"].expand(P.HEADS, -1, -1)
    return naive_attention(tensors["q_chunk"], k, v, 0.4, visible)


def test_two_rank_splits_match_one_process(tmp_path: Path) -> None:
    mp.spawn(P.run, args=(_free_port(), str(tmp_path)), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    tensors = P.case()
    unsplit = _unsplit_decode(tensors)
    for rank in ranks:  # attention DP: every rank ends with every sequence's output
        assert torch.allclose(rank["attention_dp"], unsplit, atol=1e-5)
    heads = unsplit[1].reshape(P.HEADS, P.D)  # sequence 1, per head
    for r, rank in enumerate(ranks):  # DCP: rank r keeps heads 2r, 2r + 1
        assert torch.allclose(rank["dcp"][0, :, :, 0], heads[2 * r : 2 * r + 2], atol=1e-5)
        torch.testing.assert_close(rank["dcp_op_by_op"], rank["dcp"])
    chunk = _unsplit_chunk(tensors)
    for r, rank in enumerate(ranks):  # segmented CP: rank r keeps chunk queries 2r, 2r + 1
        assert torch.allclose(rank["segmented_cp"].double(), chunk[:, 2 * r : 2 * r + 2], atol=1e-5)
