"""XGLM: the starcoder2 reference (LayerNorm with bias, GELU MLP, q/k/v/o
biases) with the attention XGLM writes out (the kernel's), its token
embeddings scaled by sqrt(d_model), and fixed sinusoidal positions
(sinusoidal-positions: rows position + 2, computed in forward). The tiny
checkpoint sets pad_token_id 4, so the zeroed padding row is position 2's
and a port ignoring it differs. Mutants of the port (an offset of 0, no
embedding scale, another base, no padding row) fail validation."""

from __future__ import annotations

import pytest

from autoport_cst.port import port
from autoport_cst.validate import build_tiny_checkpoint, validate_model
from tests.edited_copies import edited_copy

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("xglm")


@pytest.fixture(scope="module")
def ported(workdir):
    """TP=1 fp32 and bf16, and TP=2, on the checkpoint's own weights."""
    source = workdir / "xglm"
    build_tiny_checkpoint("XGLMForCausalLM", source, seed=0, dimensions={"pad_token_id": 4})
    return port(str(source), "xglm", workdir / "ports", tp=2, force=True, checkpoint="source", steps=8)


@pytest.mark.slow
def test_xglm_ports_and_validates(ported):
    assert ported.validated, [(r.tp, r.dtype, r.first_diverging) for r in ported.runs]
    assert [(r.tp, r.dtype) for r in ported.runs] == [(1, "fp32"), (1, "bf16"), (2, "fp32")]
    assert {"sinusoidal-positions", "embedding-scale"} <= set(ported.steps)
    model = (ported.package_dir / "model.py").read_text()
    assert "self.position_offset = 2" in model and "self.position_padding_idx = config.pad_token_id" in model


MUTANTS = {
    "offset 0": ("self.position_offset = 2", "self.position_offset = 0"),
    "no embedding scale": ("embed_scale=config.hidden_size**0.5", "embed_scale=1.0"),
    "base 1000": ("self.position_base = 10000.0", "self.position_base = 1000.0"),
    "no padding row": ("self.position_padding_idx = config.pad_token_id", "self.position_padding_idx = None"),
}


@pytest.mark.slow
@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_a_mutant_fails_validation(workdir, ported, mutant):
    old, new = MUTANTS[mutant]
    wrong = edited_copy(ported.package_dir, workdir / mutant.replace(" ", "_") / "xglm", [(old, new)])
    report = validate_model(wrong, ported.checkpoint_dir, tp=1, dtype="fp32", steps=4, config_variants=False)
    assert not report.equivalent
    assert report.first_diverging is not None
    assert report.first_diverging.component in ("embedding", "layers.0.attention"), report.first_diverging
