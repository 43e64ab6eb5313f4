"""Qwen2-MoE / Qwen3-MoE configs choose their MoE layers by
``decoder_sparse_step`` and ``mlp_only_layers``. The default tiny checkpoint
of such a config has a dense layer 0 beside an MoE layer 1 (step 2), so a
port of it carries the dense-layer path (dense-layers) and the default
validation drives it: the port validates, a copy whose dense / MoE choice is
inverted fails at the first layer (its load looks for a router there). A
port planned on a config whose every layer is MoE (step 1) is validated on a
tiny checkpoint that keeps step 1: its config guard refuses another step."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from autoport_cst.cli import cli
from autoport_cst.validate import build_tiny_checkpoint, validate_model

pytestmark = pytest.mark.slow

DENSE_CHOICE = "return (layer_idx + 1) % (config.decoder_sparse_step or 1) != 0"


@pytest.fixture(scope="module")
def tiny_qwen3_moe(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("tiny-qwen3-moe")
    build_tiny_checkpoint("Qwen3MoeForCausalLM", directory, seed=0)
    return directory


def _port(source: Path, out: Path) -> tuple[dict, Path]:
    outcome = out / "outcome.json"
    result = CliRunner().invoke(cli, ["port", str(source), "--out", str(out), "--json", str(outcome)])
    assert result.exit_code in (0, 1), result.output
    return json.loads(outcome.read_text()), out / "vllm_neuron" / "model" / "qwen3_moe"


def test_the_dense_layer_path_is_ported_and_validated(tmp_path: Path, tiny_qwen3_moe: Path) -> None:
    config = json.loads((tiny_qwen3_moe / "config.json").read_text())
    assert (config["decoder_sparse_step"], config["mlp_only_layers"]) == (2, [])
    outcome, package = _port(tiny_qwen3_moe, tmp_path / "out")
    assert outcome["validated"], outcome["runs"]
    model = (package / "model.py").read_text(encoding="utf-8")
    assert model.count(DENSE_CHOICE) == 1
    wrong = tmp_path / "inverted"
    shutil.copytree(package, wrong, ignore=shutil.ignore_patterns("__pycache__"))
    (wrong / "model.py").write_text(model.replace(DENSE_CHOICE, DENSE_CHOICE.replace("!= 0", "== 0")))
    report = validate_model(wrong, tiny_qwen3_moe, steps=2)
    assert not report.equivalent and report.exit_code == 1
    # layer 0 taken for an MoE layer: the port looks for its router, which the checkpoint lacks
    failed = report.failure.message if report.failure is not None else str(report.first_diverging)
    assert "layers.0" in failed, report.summary()


def test_a_port_planned_without_dense_layers_validates_on_its_own_layer_kinds(
    tmp_path: Path, tiny_qwen3_moe: Path
) -> None:
    source = tmp_path / "every-layer-moe"
    source.mkdir()
    config = json.loads((tiny_qwen3_moe / "config.json").read_text())
    config["decoder_sparse_step"] = 1
    (source / "config.json").write_text(json.dumps(config))
    outcome, package = _port(source, tmp_path / "out")
    assert outcome["validated"], outcome["runs"]
    assert DENSE_CHOICE not in (package / "model.py").read_text(encoding="utf-8")
