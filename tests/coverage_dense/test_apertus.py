"""Apertus and Apertus 1.5: Qwen3's attention (per-head q/k RMSNorms) with
a plain MLP whose activation is xIELU, learned per MLP: ``alpha_p`` and
``alpha_n`` (stored before softplus) and the scalars ``beta`` and ``eps``,
under ``mlp.act_fn`` in the checkpoint. mlp-activation computes it in
``torch_mlp`` with the four parameters loaded from those keys (replicated
on every rank). The port validates at TP=1 fp32 and bf16 and at TP=2; the
same port without the softplus on alpha_p fails."""

from __future__ import annotations

import shutil

import pytest

from autoport_cst.port import port
from autoport_cst.validate import build_tiny_checkpoint, validate_model

ARCHITECTURES = {"apertus": "ApertusForCausalLM", "apertus1p5_text": "Apertus1p5TextForCausalLM"}


@pytest.fixture(scope="module", params=sorted(ARCHITECTURES))
def ported(request, tmp_path_factory):
    """TP=1 fp32 and bf16, and TP=2, on the checkpoint's own weights."""
    name = request.param
    workdir = tmp_path_factory.mktemp(name)
    build_tiny_checkpoint(ARCHITECTURES[name], workdir / name, seed=0)
    result = port(
        str(workdir / name), name, workdir / "ports", tp=2, force=True, checkpoint="source", steps=8
    )
    return workdir, result


@pytest.mark.slow
def test_apertus_ports_and_validates(ported):
    _, result = ported
    assert result.validated, [(r.tp, r.dtype, r.first_diverging) for r in result.runs]
    assert [(r.tp, r.dtype) for r in result.runs] == [(1, "fp32"), (1, "bf16"), (2, "fp32")]
    assert "mlp-activation" in result.steps
    model = (result.package_dir / "model.py").read_text()
    for name in ("alpha_p", "alpha_n", "beta", "eps"):
        assert f'.mlp.act_fn.{name}"' in model


@pytest.mark.slow
def test_a_port_without_the_softplus_of_alpha_p_fails(ported):
    """xIELU's positive gain read as stored instead of through softplus."""
    workdir, result = ported
    wrong = workdir / "no_softplus" / result.package_dir.name
    shutil.copytree(result.package_dir, wrong)
    model = wrong / "model.py"
    text = model.read_text()
    gain = "torch.nn.functional.softplus(alpha_p) * inner * inner"
    assert text.count(gain) == 1
    model.write_text(text.replace(gain, "alpha_p * inner * inner"))
    report = validate_model(wrong, result.checkpoint_dir, tp=1, dtype="fp32", steps=4, config_variants=False)
    assert not report.equivalent
    assert report.first_diverging is not None
