"""Kernel options are implemented or refused by name, never accepted and
ignored: copies of the llama3 reference with one option of a decode-kernel
call changed fail validation naming the option, and the stand-in kernels
refuse a bool where they take a number (``True == 1``)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import torch

from autoport_cst.validate import validate_model
from autoport_cst.validate.standin import functional as NF
from autoport_cst.validate.standin.functional import KernelConstraintError, UnsupportedKernelOption


def _mutant(tmp_path: Path, source: Path, pattern: str, replacement: str) -> Path:
    target = tmp_path / "mutant"
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
    model = target / "model.py"
    text, count = re.subn(pattern, replacement, model.read_text(encoding="utf-8"))
    assert count == 1, pattern
    model.write_text(text, encoding="utf-8")
    return target


@pytest.mark.parametrize(
    "pattern, replacement, named",
    [
        (r"K_cache_transposed=False", "K_cache_transposed=True", "K_cache_transposed=True"),
        (r"transposed_out=False", "transposed_out=True", "transposed_out=True"),
        (r"out_in_sb=False", "out_in_sb=True", "out_in_sb=True"),
        # the mask laid out for blocks twice the cache's
        (r"block_len=block_size\b", "block_len=2 * block_size", "block_len=64"),
    ],
)
def test_a_changed_decode_option_fails_naming_it(
    tmp_path: Path, llama3_dir: Path, tiny_llama: Path, pattern: str, replacement: str, named: str
) -> None:
    report = validate_model(_mutant(tmp_path, llama3_dir, pattern, replacement), tiny_llama, steps=2)
    assert not report.equivalent and report.exit_code == 1
    assert report.failure.stage == "decode"
    assert named in report.failure.message


def _mask(block_len: int):
    positions = torch.tensor([[5.0, 9.0]])
    return NF.gen_attention_decode_mask(
        positions, bs=2, q_head=4, s_active=1, s_prior=128, block_len=block_len
    )


def test_decode_mask_remembers_its_block_length() -> None:
    from autoport_cst.validate.standin.decode_mask import mask_block_len

    mask = _mask(32)
    assert mask_block_len(mask) == 32
    assert mask_block_len(mask.permute(1, 0, 2, 3)) == 32  # views too
    assert mask_block_len(mask.clone()) is None
    assert mask_block_len(_mask(16)) == 16


@pytest.mark.parametrize(
    "call",
    [
        lambda: _mask(True),
        lambda: NF.router(torch.zeros(3, 8), torch.zeros(8, 4), top_k=True),
        lambda: NF.flash_attention(
            torch.zeros(2, 4, 8), torch.zeros(2, 8, 4), torch.zeros(2, 4, 8), sliding_window=True
        ),
        lambda: NF.qkv_proj(torch.zeros(1, 4, 8), torch.zeros(8, 24), d_head=True),
    ],
)
def test_a_bool_is_not_taken_for_a_number(call) -> None:
    with pytest.raises(UnsupportedKernelOption, match="is a bool where the kernel takes a number"):
        call()


def test_moe_cte_skip_modes_and_conditions() -> None:
    from autoport_cst.validate.standin.moe import MoECTEImplementation

    g = torch.Generator().manual_seed(0)
    tokens, hidden, experts, inter = 5, 8, 2, 4
    x = torch.randn(tokens, hidden, generator=g)
    affinities = NF.router(x, torch.randn(hidden, experts, generator=g), top_k=2)
    masked, positions, block_to_expert, conditions = NF.build_blockwise_mapping(affinities, experts, 2, 4)
    weights = {
        "gate_up_proj_weight": torch.randn(experts, hidden, 2, inter, generator=g),
        "down_proj_weight": torch.randn(experts, inter, hidden, generator=g),
    }

    def run(**options):
        options.setdefault("compute_dtype", torch.float32)
        return NF.moe_cte(
            x,
            masked,
            token_position_to_id=positions,
            block_to_expert=block_to_expert,
            block_size=4,
            implementation=MoECTEImplementation.shard_on_block,
            **weights,
            **options,
        )

    full = run(skip_token=True, conditions=conditions)
    with pytest.raises(KernelConstraintError, match="skip_token=True"):
        run(conditions=conditions)
    # a token routed to two experts keeps one without accumulation
    assert not torch.allclose(run(skip_token=True, is_tensor_update_accumulating=False), full)
    # blocks whose condition is 0 are not computed
    assert torch.count_nonzero(run(skip_token=True, conditions=torch.zeros_like(conditions))) == 0
    # the experts in bf16 round
    assert not torch.equal(run(skip_token=True, compute_dtype=torch.bfloat16), full)
