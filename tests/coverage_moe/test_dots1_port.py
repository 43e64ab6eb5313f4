"""dots.llm1 ports from qwen3_moe: Qwen3-style attention (per-head q/k
RMSNorms) with a DeepSeek-V3-style MoE, sigmoid routing with a per-expert
routing bias that affects the selection only, and shared experts
(``router-activation``, ``routing-bias``, ``shared-experts``). Its default
config leaves the expert counts None; the tiny checkpoint gives them their
tiny values (validate/tiny_unset.py). A copy of the port that selects the
experts without the routing bias fails validation at the MoE layer."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

pytest.importorskip("transformers")

BIASED = "chosen = torch.topk(scores + self.routing_bias,"
UNBIASED = "chosen = torch.topk(scores,"


@pytest.fixture(scope="module")
def dots1(tmp_path_factory, request):
    from autoport_cst.validate import build_tiny_checkpoint
    from tests.validation_depth import feature_depth, port_at_depth

    source = tmp_path_factory.mktemp("src-dots1")
    build_tiny_checkpoint("Dots1ForCausalLM", source, seed=0)
    out = tmp_path_factory.mktemp("out-dots1")
    depth = feature_depth(request.config)
    return source, port_at_depth(depth, str(source), "cov_dots1", out, tp=1, steps=8, force=True)


@pytest.mark.slow
def test_dots1_ports_from_qwen3_moe(dots1):
    _, result = dots1
    assert result.reference == "qwen3_moe"
    assert {"router-activation", "routing-bias", "shared-experts"} <= set(result.steps)
    runs = {run.dtype: run for run in result.runs if run.tp == 1}
    assert runs["fp32"].equivalent, runs["fp32"].summary
    assert runs["bf16"].equivalent, runs["bf16"].summary


@pytest.mark.slow
def test_dots1_without_its_routing_bias_fails_validation(dots1, tmp_path):
    from autoport_cst.validate.api import validate_model

    source, result = dots1
    package = tmp_path / Path(result.package_dir).name
    shutil.copytree(result.package_dir, package)
    model = package / "model.py"
    text = model.read_text(encoding="utf-8")
    assert text.count(BIASED) == 1
    model.write_text(text.replace(BIASED, UNBIASED), encoding="utf-8")
    report = validate_model(package, source, dtype="fp32", steps=4)
    assert not report.equivalent
    assert report.first_diverging is not None and "mlp" in report.first_diverging.component
