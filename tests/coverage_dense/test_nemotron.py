"""Nemotron: a plain squared-ReLU MLP and LayerNorm1P, ``nn.LayerNorm``
subclassed with a forward that applies ``1 + weight`` (and the bias) through
``F.layer_norm(*_cast_if_autocast_enabled(...))``. Research reads it as a
LayerNorm with bias and unit offset; the port (swap-norm's LayerNorm with
bias, norm-offset's ``1.0 + weight``) validates, and the same port with the
offset taken out fails at the first norm."""

from __future__ import annotations

import shutil

import pytest

from autoport_cst.port import port
from autoport_cst.validate import build_tiny_checkpoint, validate_model


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("nemotron")


@pytest.fixture(scope="module")
def nemotron(workdir):
    source = workdir / "nemotron"
    build_tiny_checkpoint("NemotronForCausalLM", source, seed=0)
    return source


@pytest.fixture(scope="module")
def ported(workdir, nemotron):
    """TP=1 fp32 and bf16, and TP=2, on the checkpoint's own weights."""
    return port(str(nemotron), "nemotron", workdir / "ports", tp=2, force=True, checkpoint="source", steps=8)


@pytest.mark.slow
def test_nemotron_ports_and_validates(ported):
    assert ported.validated, [(r.tp, r.dtype, r.first_diverging) for r in ported.runs]
    assert [(r.tp, r.dtype) for r in ported.runs] == [(1, "fp32"), (1, "bf16"), (2, "fp32")]
    assert {"swap-norm", "norm-offset", "mlp-activation"} <= set(ported.steps)


@pytest.mark.slow
def test_a_port_without_the_unit_offset_fails(workdir, ported):
    """The port with its norms applying ``weight`` instead of ``1 + weight``."""
    wrong = workdir / "no_offset" / "nemotron"
    shutil.copytree(ported.package_dir, wrong)
    model = wrong / "model.py"
    text = model.read_text()
    offset = "(1.0 + self.weight.to(torch.float32))"
    assert text.count(offset) == 1
    model.write_text(text.replace(offset, "self.weight.to(torch.float32)"))
    report = validate_model(wrong, ported.checkpoint_dir, tp=1, dtype="fp32", steps=4, config_variants=False)
    assert not report.equivalent
    assert report.first_diverging is not None
