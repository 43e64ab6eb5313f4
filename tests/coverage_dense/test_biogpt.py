"""BioGPT: OPT's layer (its own fc1/fc2 feed-forward, learned positions with
two rows before position 0) with the embeddings scaled by sqrt(hidden_size)
and LayerNorms built as ``nn.LayerNorm(embed_dim)``: their epsilon is
torch's default, 1e-5, while config.json holds ``layer_norm_eps`` 1e-12 that
the code never reads. The port writes the code's epsilon (swap-norm's
``fixed_eps``) and validates. A port reading config.json's epsilon, as the
port did before, passes the plain fp32 comparison on the tiny checkpoint
(the embeddings' scale keeps the activations' variance far above either
epsilon); it fails the follow-up that sets the fields transformers never
reads far from their value (``validate.unread_fields``)."""

from __future__ import annotations

import re
import shutil

import pytest

from autoport_cst.port import port
from autoport_cst.validate import build_tiny_checkpoint, validate_model


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("biogpt")


@pytest.fixture(scope="module")
def biogpt(workdir):
    source = workdir / "biogpt"
    build_tiny_checkpoint("BioGptForCausalLM", source, seed=0)
    return source


@pytest.fixture(scope="module")
def ported(workdir, biogpt):
    """TP=1 fp32 and bf16, and TP=2, on the checkpoint's own weights."""
    return port(str(biogpt), "biogpt", workdir / "ports", tp=2, force=True, checkpoint="source", steps=8)


@pytest.mark.slow
def test_biogpt_ports_and_validates(ported):
    assert ported.validated, [(r.tp, r.dtype, r.first_diverging) for r in ported.runs]
    assert [(r.tp, r.dtype) for r in ported.runs] == [(1, "fp32"), (1, "bf16"), (2, "fp32")]
    assert "swap-norm" in ported.steps
    model = (ported.package_dir / "model.py").read_text()
    assert "1e-05" in model and "layer_norm_eps" not in model
    assert "layer_norm_eps" not in (ported.package_dir / "config.py").read_text()


@pytest.mark.slow
def test_a_port_reading_config_json_s_epsilon_fails(workdir, ported):
    """The port as it was written before: its norms built with
    config.layer_norm_eps (1e-12 in config.json)."""
    wrong = workdir / "wrong_eps" / "biogpt"
    shutil.copytree(ported.package_dir, wrong)
    model = wrong / "model.py"
    model.write_text(model.read_text().replace("1e-05", "config.layer_norm_eps"))
    config = wrong / "config.py"
    text = config.read_text()
    field = re.search(r"\n(    hidden_size: int = \d+\n)", text)
    assert field is not None
    config.write_text(text.replace(field.group(1), field.group(1) + "    layer_norm_eps: float = 1e-5\n", 1))
    report = validate_model(wrong, ported.checkpoint_dir, tp=1, dtype="fp32", steps=4, parallel_layouts=False)
    assert report.unread_config_fields == {"layer_norm_eps": 1e-12}
    assert not report.equivalent
    assert report.first_diverging is not None
    assert (
        "config fields transformers never reads: layer_norm_eps 1e-12 -> 0.5"
        in report.first_diverging.message
    )
    # the port as written reads no such field: nothing to vary
    right = validate_model(
        ported.package_dir, ported.checkpoint_dir, tp=1, dtype="fp32", steps=4, parallel_layouts=False
    )
    assert right.equivalent and right.unread_config_fields == {}
