"""Cohere2 MoE ports from qwen3_moe: its parallel residual with one shared
norm (``h + attn(norm(h)) + moe(norm(h))``) on the MoE layer, whose pre-MLP
norm lives in the experts (next to the router, for the decode kernel):
``parallel-residual`` hands the MoE the layer input in every forward
(prefill and decode, the decode terms carried through the data-parallel
transitions), and the experts' norm loads the input norm's weights. Its
LayerNorm (``swap-norm``) turns the experts' fused decode kernel, an
RMSNorm, off (``fused_decode = False``). Its softmax over the top-k logits
sums to 1 whatever ``norm_topk_prob`` says, so the plan fixes the
renormalization in code (``norm-topk-prob``). A copy of the port whose MLP
reads the attention's sum (a sequential residual) fails validation at layer
0's MLP.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

pytest.importorskip("transformers")

PARALLEL = "mlp_output = self.mlp(residual, "
SEQUENTIAL = "mlp_output = self.mlp(residual + attn_output, "


@pytest.fixture(scope="module")
def cohere2_moe(tmp_path_factory, request):
    from autoport_cst.validate import build_tiny_checkpoint
    from tests.validation_depth import feature_depth, port_at_depth

    source = tmp_path_factory.mktemp("src-cohere2-moe")
    build_tiny_checkpoint("Cohere2MoeForCausalLM", source, seed=0)
    out = tmp_path_factory.mktemp("out-cohere2-moe")
    depth = feature_depth(request.config)
    return source, port_at_depth(depth, str(source), "cov_cohere2_moe", out, tp=1, steps=8, force=True)


def test_cohere2_moe_ports_with_its_parallel_residual(cohere2_moe):
    _, result = cohere2_moe
    assert result.reference == "qwen3_moe"
    assert {"parallel-residual", "swap-norm", "norm-topk-prob"} <= set(result.steps)
    runs = {run.dtype: run for run in result.runs if run.tp == 1}
    assert runs["fp32"].equivalent, runs["fp32"].summary
    assert runs["bf16"].equivalent, runs["bf16"].summary
    text = (Path(result.package_dir) / "model.py").read_text(encoding="utf-8")
    assert text.count(PARALLEL) == 2  # decode and prefill
    assert "self.fused_decode = False" in text and "self.norm_topk_prob = True" in text


def test_cohere2_moe_with_a_sequential_residual_fails_validation(cohere2_moe, tmp_path):
    from autoport_cst.validate.api import validate_model

    source, result = cohere2_moe
    package = tmp_path / Path(result.package_dir).name
    shutil.copytree(result.package_dir, package)
    model = package / "model.py"
    text = model.read_text(encoding="utf-8")
    model.write_text(text.replace(PARALLEL, SEQUENTIAL), encoding="utf-8")
    report = validate_model(
        package, source, dtype="fp32", steps=4, config_variants=False, parallel_layouts=False
    )
    assert not report.equivalent
    assert report.first_diverging is not None and report.first_diverging.component.startswith("layers.0.mlp")


@pytest.mark.slow
def test_cohere2_moe_validates_at_tp2(cohere2_moe):
    from autoport_cst.validate.api import validate_model

    source, result = cohere2_moe
    report = validate_model(Path(result.package_dir), source, dtype="fp32", steps=4, tp=2)
    assert report.equivalent, report.summary()
