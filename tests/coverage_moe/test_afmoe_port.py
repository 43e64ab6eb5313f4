"""AfMoE ports from qwen3_moe with its attention output gate
(``attention-output-gate``: the attention output times the sigmoid of
``gate_proj`` of the layer input, before ``o_proj``), its sandwich norms on
every layer, MoE and dense, and its router one module down
(``mlp.router.gate``, beside ``mlp.experts`` and ``mlp.shared_experts``: the
MoE block keeps its name in the key map). The tiny checkpoint keeps the
config's dense layer 0 (``num_dense_layers=1``): ``dense-layers`` builds
``self.mlp = AfmoeDenseMLP(config) if _layer_is_dense(...) else
AfmoeMLP(config)``, whose pre-MLP norm, like the experts', loads from
``pre_mlp_layernorm`` (``norm-placement``). A copy of the port whose gate
multiplies by 1 fails validation at the attention; one whose dense MLP
loads its norm from ``post_attention_layernorm`` (the key before the
sandwich placement) fails at layer 0's MLP.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

pytest.importorskip("transformers")

UNGATED = "return attn\n"
GATED = "return attn * torch.sigmoid(gate).to(attn.dtype)\n"


@pytest.fixture(scope="module")
def afmoe(tmp_path_factory, request):
    from autoport_cst.validate import build_tiny_checkpoint
    from tests.validation_depth import feature_depth, port_at_depth

    source = tmp_path_factory.mktemp("src-afmoe")
    build_tiny_checkpoint("AfmoeForCausalLM", source, seed=0)
    out = tmp_path_factory.mktemp("out-afmoe")
    depth = feature_depth(request.config)
    return source, port_at_depth(depth, str(source), "cov_afmoe", out, tp=1, steps=8, force=True)


def test_afmoe_ports_with_its_output_gate(afmoe):
    _, result = afmoe
    assert result.reference == "qwen3_moe"
    assert {"attention-output-gate", "norm-placement", "shared-experts"} <= set(result.steps)
    runs = {run.dtype: run for run in result.runs if run.tp == 1}
    assert runs["fp32"].equivalent, runs["fp32"].summary
    assert runs["bf16"].equivalent, runs["bf16"].summary


def test_afmoe_without_its_output_gate_fails_validation(afmoe, tmp_path):
    from autoport_cst.validate.api import validate_model

    source, result = afmoe
    package = tmp_path / Path(result.package_dir).name
    shutil.copytree(result.package_dir, package)
    model = package / "model.py"
    text = model.read_text(encoding="utf-8")
    assert text.count(GATED) == 1
    model.write_text(text.replace(GATED, UNGATED), encoding="utf-8")
    report = validate_model(package, source, dtype="fp32", steps=4)
    assert not report.equivalent
    assert report.first_diverging is not None and "attention" in report.first_diverging.component


def test_afmoe_dense_layer_without_its_pre_mlp_norm_fails_validation(afmoe, tmp_path):
    from autoport_cst.validate.api import validate_model

    source, result = afmoe
    package = tmp_path / Path(result.package_dir).name
    shutil.copytree(result.package_dir, package)
    model = package / "model.py"
    text = model.read_text(encoding="utf-8")
    placed = (
        'mappings[f"{prefix}.mlp.post_attention_layernorm.weight"] = f"{prefix}.pre_mlp_layernorm.weight"'
    )
    assert text.count(placed) == 1
    model.write_text(
        text.replace(placed, placed.replace("pre_mlp_layernorm", "post_attention_layernorm")),
        encoding="utf-8",
    )
    report = validate_model(
        package, source, dtype="fp32", steps=4, config_variants=False, parallel_layouts=False
    )
    assert not report.equivalent
    assert report.first_diverging is not None and report.first_diverging.component.startswith("layers.0.mlp")


@pytest.mark.slow
def test_afmoe_validates_at_tp2(afmoe):
    from autoport_cst.validate.api import validate_model

    source, result = afmoe
    report = validate_model(Path(result.package_dir), source, dtype="fp32", steps=4, tp=2)
    assert report.equivalent, report.summary()
