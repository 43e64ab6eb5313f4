"""Copies of the qwen3_vl reference broken in one vision-language place do not
validate, and the report names where they diverge first: M-RoPE frequency
pairs given to T, H, W in contiguous sections (Qwen2-VL's layout) instead of
interleaved; the text after an image resuming one position per image token;
decode steps rotated by their 1-D positions (no M-RoPE delta); the image
features not merged; the deep-stack features not added; the
mergers' GELU taken in its tanh approximation; at TP=2, every rank
loading the first rank's heads of the tower's fused QKV."""

from __future__ import annotations

import pytest

from autoport_cst.validate.vision_validate import validate_vlm
from tests.edited_copies import edited_copy

from .conftest import REFERENCE

MUTANTS = {
    "mrope-sections-contiguous": (
        "model.py",
        "axis = torch.where((pair % 3 == row) & (pair < 3 * self.mrope_section[row]), row, axis)",
        "axis = torch.where(pair >= sum(self.mrope_section[:row]), row, axis)",
        "image:layers.0.attention",
    ),
    "positions-after-image": (
        "vision_preprocessing.py",
        "current += max(gh, gw)",
        "current += t * gh * gw",
        "image:mrope_positions",
    ),
    # decode rotates by the 1-D positions, not position + delta: only an image sequence's decode rows differ
    "decode-without-mrope-delta": (
        "model.py",
        "        if rotary_position_ids is None:\n            rotary_position_ids = positions\n",
        "        if rotary_position_ids is None or not is_prefill:\n            rotary_position_ids = positions\n",
        "image:layers.0.attention",
    ),
    "image-not-merged": (
        "model.py",
        "hidden_states = torch.where(mask, features, hidden_states)",
        "hidden_states = hidden_states",
        "image:layers.0.input_norm",
    ),
    "deepstack-not-added": (
        "model.py",
        "hidden_states = hidden_states + deepstack_embeds[layer_idx].to(hidden_states.dtype)",
        "hidden_states = hidden_states",
        "image:layers.1.input_norm",
    ),
    # every TP rank loads rank 0's heads of the tower's fused QKV: right at TP=1 only
    "tower-qkv-heads-of-rank-0": (
        "weight_loaders.py",
        """    def transform(slices, rank: int) -> torch.Tensor:
        start = rank * size_per_rank
        parts = [
            slices[0][part * hidden_size + start : part * hidden_size + start + size_per_rank]
            for part in range(3)
        ]
        return torch.cat(parts, dim=0).T""",
        """    def transform(slices, rank: int) -> torch.Tensor:
        start = 0 * rank
        parts = [
            slices[0][part * hidden_size + start : part * hidden_size + start + size_per_rank]
            for part in range(3)
        ]
        return torch.cat(parts, dim=0).T""",
        "image:vision.blocks.0",
    ),
    "merger-gelu-tanh": (
        "vision_encoder.py",
        "torch.nn.functional.gelu(hidden_states.to(torch.float32))",
        'torch.nn.functional.gelu(hidden_states.to(torch.float32), approximate="tanh")',
        "image:vision.deepstack.0",
    ),
}


def _mutant(tmp_path, file: str, old: str, new: str):
    return edited_copy(REFERENCE, tmp_path / "qwen3_vl", [(old, new)], file=file)


def _run(tmp_path, tiny, name, tp=1):
    file, old, new, expected = MUTANTS[name]
    report = validate_vlm(_mutant(tmp_path, file, old, new), tiny, steps=1, tp=tp)
    assert not report.equivalent
    assert report.failure is None, report.failure
    assert report.first_diverging == expected


def test_contiguous_mrope_sections_diverge_at_the_first_attention_of_the_image_prompt(
    tmp_path, tiny_qwen3_vl
):
    _run(tmp_path, tiny_qwen3_vl, "mrope-sections-contiguous")


@pytest.mark.slow
@pytest.mark.parametrize(
    "name", sorted(set(MUTANTS) - {"mrope-sections-contiguous", "tower-qkv-heads-of-rank-0"})
)
def test_mutant_diverges_where_it_is_broken(tmp_path, tiny_qwen3_vl, name):
    _run(tmp_path, tiny_qwen3_vl, name)


@pytest.mark.slow
def test_tower_heads_loaded_for_another_rank_diverge_at_tp2(tmp_path, tiny_qwen3_vl):
    file, old, new, _ = MUTANTS["tower-qkv-heads-of-rank-0"]
    assert validate_vlm(_mutant(tmp_path, file, old, new), tiny_qwen3_vl, steps=1).equivalent  # TP=1
    _run(tmp_path / "tp2", tiny_qwen3_vl, "tower-qkv-heads-of-rank-0", tp=2)
