"""Exhaustive or refuse: a codemod that changes a family of sites must edit
every site of it, or the port stops naming each site it left, at its
position in the reference file as the user has it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from autoport_cst.cli import cli

ROOT = Path(__file__).resolve().parents[2]
MISTRAL = ROOT / "examples" / "mistral.plan.json"

# a prefill branch through a kernel no codemod knows
FLASH = "            attn_output = NF.flash_attention("
SEGMENTED = """            extra = NF.chunked_attention(q, k_cache=self.k_cache, v_cache=self.v_cache, scale=self.scaling)
"""


@pytest.fixture
def reference_with_segmented_prefill(tmp_path):
    reference = tmp_path / "llama3"
    shutil.copytree(ROOT / "reference_models" / "llama3", reference)
    model = reference / "model.py"
    text = model.read_text()
    assert text.count(FLASH) == 1
    model.write_text(text.replace(FLASH, SEGMENTED + FLASH))
    line = text[: text.index(FLASH)].count("\n") + 1  # the inserted call's line
    return reference, line


def test_a_kernel_the_codemod_left_stops_the_port(reference_with_segmented_prefill, tmp_path):
    reference, line = reference_with_segmented_prefill
    out = tmp_path / "out"
    result = CliRunner().invoke(
        cli, ["apply", "--plan", str(MISTRAL), "--ref", str(reference), "--out", str(out)]
    )
    assert result.exit_code == 2, result.output
    assert "sliding-window changes attention.kernel" in result.output
    # the site, named and placed in the reference file as it is on disk
    assert f"llama3/model.py:{line}:" in result.output
    assert "MistralAttention.forward_prefill: NF.chunked_attention" in result.output
    assert not out.exists()


def test_positions_of_codemod_errors_point_into_the_reference(tmp_path):
    """rename-classes runs first and changes no line count, sliding-window
    adds lines; a precondition raised after them still names the reference
    line."""
    reference = tmp_path / "llama3"
    shutil.copytree(ROOT / "reference_models" / "llama3", reference)
    model = reference / "model.py"
    text = model.read_text()
    # the decode mask already given a start position: sliding-window's precondition fails on it
    mask_call = "            attention_mask = NF.gen_attention_decode_mask("
    start = text.index(mask_call)
    assert text.count("                start_pos=None,\n", start, start + 600) == 1
    model.write_text(
        text[:start]
        + text[start:].replace("                start_pos=None,\n", "                start_pos=0,\n", 1)
    )
    decode_line = text[:start].count("\n") + 1
    result = CliRunner().invoke(
        cli, ["apply", "--plan", str(MISTRAL), "--ref", str(reference), "--out", str(tmp_path / "out")]
    )
    assert result.exit_code == 2, result.output
    assert f"llama3/model.py:{decode_line}:" in result.output, result.output
