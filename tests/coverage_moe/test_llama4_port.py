"""Llama 4 text ports from qwen3_moe: its RoPE layers attend within chunks of
``attention_chunk_size`` tokens (``chunked-attention``; the tiny checkpoint's
chunk is 12 tokens, so the 20-token prompt's prefill, the segmented calls
and every prompt's decode cross a chunk), normalise the rotated q and k by a
weightless L2 norm (``weightless-qk-norm`` on the RoPE layers,
``qk-norm-position``), and its layer without RoPE scales its queries by the
attention temperature (``nope-layers``, ``position-scaled-attention``); the
MoE is top-1 sigmoid routing on router-weighted expert inputs with a shared
expert. Copies of the port that attend across chunks, or skip the q/k norm,
fail validation at the attention.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

pytest.importorskip("transformers")

CHUNKED = "self.attention_chunk_size = _layer_chunk_size(config, layer_idx)\n"
UNCHUNKED = "self.attention_chunk_size = None\n"
NORMED = "self.use_qk_norm = _layer_uses_rope(config, layer_idx)\n"
UNNORMED = "self.use_qk_norm = False\n"


@pytest.fixture(scope="module")
def llama4(tmp_path_factory, request):
    from autoport_cst.validate import build_tiny_checkpoint
    from tests.validation_depth import FULL, OWN, port_at_depth, slow_run

    source = tmp_path_factory.mktemp("src-llama4")
    build_tiny_checkpoint("Llama4ForCausalLM", source, seed=0)
    out = tmp_path_factory.mktemp("out-llama4")
    depth = FULL if slow_run(request.config) else OWN
    return source, port_at_depth(depth, str(source), "cov_llama4_text", out, tp=1, steps=8, force=True)


def test_llama4_text_ports_with_chunked_attention_and_weightless_qk_norms(llama4):
    _, result = llama4
    assert result.reference == "qwen3_moe"
    wanted = {
        "chunked-attention",
        "weightless-qk-norm",
        "qk-norm-position",
        "nope-layers",
        "position-scaled-attention",
    }
    assert wanted <= set(result.steps)
    runs = {run.dtype: run for run in result.runs if run.tp == 1}
    assert runs["fp32"].equivalent, runs["fp32"].summary
    assert runs["bf16"].equivalent, runs["bf16"].summary


def _mutant_fails_at_the_attention(llama4, tmp_path, original: str, mutant: str) -> None:
    from autoport_cst.validate.api import validate_model

    source, result = llama4
    package = tmp_path / Path(result.package_dir).name
    shutil.copytree(result.package_dir, package)
    model = package / "model.py"
    text = model.read_text(encoding="utf-8")
    assert text.count(original) == 1
    model.write_text(text.replace(original, mutant), encoding="utf-8")
    report = validate_model(
        package, source, dtype="fp32", steps=4, config_variants=False, parallel_layouts=False
    )
    assert not report.equivalent
    assert report.first_diverging is not None and report.first_diverging.component == "layers.0.attention"


def test_llama4_text_attending_across_chunks_fails_validation(llama4, tmp_path):
    _mutant_fails_at_the_attention(llama4, tmp_path, CHUNKED, UNCHUNKED)


@pytest.mark.slow
def test_llama4_text_without_its_qk_norm_fails_validation(llama4, tmp_path):
    _mutant_fails_at_the_attention(llama4, tmp_path, NORMED, UNNORMED)


@pytest.mark.slow
def test_llama4_text_validates_at_tp2(llama4):
    from autoport_cst.validate.api import validate_model

    source, result = llama4
    report = validate_model(Path(result.package_dir), source, dtype="fp32", steps=8, tp=2)
    assert report.equivalent, report.summary()
