"""The sqrt(hidden_size) embedding scale in the two forms transformers
writes, told apart by research from the code (``embedding.scale_dtype``)
and realized by embedding-scale: Gemma makes it a tensor and casts it to the
weights' dtype before the multiply (rounded in bfloat16: sqrt(72) = 8.485
becomes 8.5), XGLM and BioGPT multiply by the Python float (unrounded). On a
width whose square root bfloat16 does not hold exactly (72), each port
validates in bf16; XGLM's port with Gemma's rounded form fails there at the
embedding. (Gemma's port with the unrounded float is nearer the fp32
reference than transformers' bf16 run, so the r_ratio gate cannot fail it.)"""

from __future__ import annotations

import shutil

import pytest

from autoport_cst.port import port
from autoport_cst.validate import build_tiny_checkpoint, validate_model

pytest.importorskip("transformers")

ROUNDED = "return output * output.new_tensor(self.embed_scale)"
UNROUNDED = "return output * self.embed_scale"


@pytest.mark.parametrize(
    ("architecture", "dtype"),
    [("XGLMForCausalLM", "float"), ("BioGptForCausalLM", "float"), ("GemmaForCausalLM", "model")],
)
def test_research_reads_the_scale_s_dtype_from_the_code(tmp_path, architecture, dtype):
    from autoport_cst.research import research

    build_tiny_checkpoint(architecture, tmp_path / "src", seed=0)
    found = research(str(tmp_path / "src"))
    assert (found.spec.embedding.scale, found.spec.embedding.scale_dtype) == ("sqrt_hidden", dtype)
    evidence = found.decision("embedding.scale_dtype").evidence
    assert ("rounded" if dtype == "model" else "Python float") in evidence, evidence


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("scale-dtype")


def _port(workdir, architecture, name, dimensions):
    source = workdir / name
    build_tiny_checkpoint(architecture, source, seed=0, dimensions=dimensions)
    return port(str(source), name, workdir / f"{name}-ports", tp=1, force=True, checkpoint="source", steps=8)


@pytest.mark.slow
def test_xglm_at_width_72_validates_in_bf16_and_the_rounded_form_fails(workdir):
    ported = _port(workdir, "XGLMForCausalLM", "xglm", {"d_model": 72, "pad_token_id": 4})
    assert ported.validated, [(r.dtype, r.first_diverging) for r in ported.runs]
    assert [r.dtype for r in ported.runs] == ["fp32", "bf16"]
    model = (ported.package_dir / "model.py").read_text()
    assert model.count(UNROUNDED) == 1 and ROUNDED not in model
    wrong = workdir / "rounded" / "xglm"
    shutil.copytree(ported.package_dir, wrong)
    (wrong / "model.py").write_text(model.replace(UNROUNDED, ROUNDED))
    report = validate_model(wrong, ported.checkpoint_dir, tp=1, dtype="bf16", steps=4, config_variants=False)
    assert not report.equivalent
    assert report.first_diverging is not None and report.first_diverging.component == "embedding"


@pytest.mark.slow
def test_gemma_at_width_72_keeps_the_rounded_form_and_validates_in_bf16(workdir):
    ported = _port(workdir, "GemmaForCausalLM", "gemma", {"hidden_size": 72})
    assert ported.validated, [(r.dtype, r.first_diverging) for r in ported.runs]
    assert [r.dtype for r in ported.runs] == ["fp32", "bf16"]
    assert (ported.package_dir / "model.py").read_text().count(ROUNDED) == 1
