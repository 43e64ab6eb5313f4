"""Benchmark: one decode step of multi-latent attention on the CPU stand-in,
absorbed against expanded.

Both forms attend, for a batch of sequences of ``context`` cached tokens,
over the same paged latent cache ``[blocks, 1, block_size, r + dr]``:

- absorbed (what the deepseek_v3 reference decodes with): each head's query
  lifted into the latent space (``NF.mla_absorb`` with the key half of
  ``kv_b_proj``), ``NF.mla_decode_attention`` over the latent rows, the
  result brought back to the value width (``NF.mla_absorb`` with the value
  half);
- expanded: every cached latent expanded into per-head keys and values
  through ``kv_b_proj``, then the stand-in's softmax attention
  (``softmax_attention``, the numerics of its decode kernels).

Printed per size: the median time of each over ``--repeat`` runs (compute
only, one intra-op thread, as validation runs), the ratio expanded /
absorbed (target >= 1: absorption must not be slower) and the relative
difference of the two outputs. Sizes: the tests' tiny checkpoint (4 heads,
latent 32, rope 8, nope 16, value 16) and one TP=8 rank of DeepSeek-V3 (16
heads, latent 512, rope 64, nope 128, value 128), at 64 and 2048 tokens.

Usage: python benchmarks/mla_decode.py [--repeat N]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from autoport_cst.validate.standin.mla import mla_absorb, mla_decode_attention  # noqa: E402
from autoport_cst.validate.standin.prefill_attention import softmax_attention  # noqa: E402

BLOCK = 32


@dataclass(frozen=True)
class Size:
    label: str
    batch: int
    heads: int
    rank: int
    rope: int
    nope: int
    value: int
    context: int


SIZES = (
    Size("tiny checkpoint", 3, 4, 32, 8, 16, 16, 64),
    Size("DeepSeek-V3, one TP=8 rank", 4, 16, 512, 64, 128, 128, 2048),
)


def make_inputs(size: Size, seed: int = 0) -> dict:
    """A shuffled paged latent cache holding ``context`` rows per sequence, its
    block table, ``kv_b_proj`` per head and the step's queries."""
    generator = torch.Generator().manual_seed(seed)
    blocks = size.batch * size.context // BLOCK
    order = torch.randperm(blocks, generator=generator) + 1
    return {
        "cache": torch.randn(blocks + 2, 1, BLOCK, size.rank + size.rope, generator=generator),
        "table": order.view(size.batch, -1).to(torch.int32),
        "kv_b": torch.randn(size.heads, size.nope + size.value, size.rank, generator=generator)
        * size.rank**-0.5,
        "q_nope": torch.randn(size.batch, size.heads, size.nope, generator=generator),
        "q_rope": torch.randn(size.batch, size.heads, size.rope, generator=generator),
        "positions": torch.full((size.batch,), size.context - 1),
    }


def absorbed(size: Size, x: dict) -> torch.Tensor:
    k_half, v_half = x["kv_b"].split([size.nope, size.value], dim=1)
    query = torch.cat((mla_absorb(x["q_nope"], k_half), x["q_rope"]), dim=-1)
    latent = mla_decode_attention(
        query,
        x["cache"],
        None,
        (size.nope + size.rope) ** -0.5,
        None,
        positions=x["positions"],
        compress_ratio=1,
        latent_block_table=x["table"],
        nope_dim=size.rank,
        rope_dim=size.rope,
        out_dtype=torch.float32,
    )
    return mla_absorb(latent[..., : size.rank], v_half.transpose(1, 2))


def expanded(size: Size, x: dict) -> torch.Tensor:
    k_half, v_half = x["kv_b"].split([size.nope, size.value], dim=1)
    outputs = []
    for b in range(size.batch):
        rows = x["cache"][x["table"][b].to(torch.int64), 0].flatten(0, 1)[: size.context]
        latent, k_rope = rows.split([size.rank, size.rope], dim=-1)
        keys = torch.cat(
            (torch.einsum("tr,hnr->htn", latent, k_half), k_rope.unsqueeze(0).expand(size.heads, -1, -1)), -1
        )
        values = torch.einsum("tr,hvr->htv", latent, v_half)
        query = torch.cat((x["q_nope"][b], x["q_rope"][b]), dim=-1).unsqueeze(1)
        visible = torch.ones(1, size.context, dtype=torch.bool)
        outputs.append(softmax_attention(query, keys, values, (size.nope + size.rope) ** -0.5, visible, None))
    return torch.stack(outputs).squeeze(2)


def median_ms(function, size: Size, x: dict, repeat: int) -> float:
    function(size, x)  # warm-up
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        function(size, x)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def measure(size: Size, repeat: int) -> tuple[float, float, float]:
    """(absorbed ms, expanded ms, relative difference of the outputs)."""
    x = make_inputs(size)
    a, e = absorbed(size, x), expanded(size, x)
    difference = ((a - e).norm() / e.norm()).item()
    return median_ms(absorbed, size, x, repeat), median_ms(expanded, size, x, repeat), difference


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="timed runs per form and size")
    args = parser.parse_args()
    torch.set_num_threads(1)
    met = True
    for size in SIZES:
        absorbed_ms, expanded_ms, difference = measure(size, args.repeat)
        ratio = expanded_ms / absorbed_ms
        met &= ratio >= 1.0
        print(
            f"{size.label} (batch {size.batch}, {size.heads} heads, latent {size.rank} + rope {size.rope}, "
            f"{size.context} tokens): absorbed {absorbed_ms:.2f} ms, expanded {expanded_ms:.2f} ms, "
            f"expanded / absorbed {ratio:.2f}x (target >= 1: {'met' if ratio >= 1.0 else 'MISSED'}), "
            f"outputs differ by {difference:.1e}"
        )
    return 0 if met else 1


if __name__ == "__main__":
    raise SystemExit(main())
