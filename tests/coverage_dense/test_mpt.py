"""MPT: ALiBi (alibi-positions) on the llama3 reference, with 12 heads, not a
power of two (the slopes of 16 heads, the even ones first, cut to 12), and
its MLP's own residual add read as the block's. The port validates at TP=1
fp32 and bf16 and TP=2 on the checkpoint's own weights; with every rank given
the first ranks' slopes it fails TP=2 at the first attention."""

from __future__ import annotations

import re
import shutil

import pytest

from autoport_cst.port import port
from autoport_cst.validate import build_tiny_checkpoint, validate_model


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("mpt")


@pytest.fixture(scope="module")
def ported(workdir):
    source = workdir / "mpt"
    build_tiny_checkpoint("MptForCausalLM", source, seed=0, dimensions={"n_heads": 12, "d_model": 96})
    return port(str(source), "mpt", workdir / "ports", tp=2, force=True, checkpoint="source", steps=8)


@pytest.mark.slow
def test_mpt_ports_and_validates(ported):
    assert ported.validated, [(r.tp, r.dtype, r.first_diverging) for r in ported.runs]
    assert [(r.tp, r.dtype) for r in ported.runs] == [(1, "fp32"), (1, "bf16"), (2, "fp32")]
    assert "alibi-positions" in ported.steps
    model = (ported.package_dir / "model.py").read_text()
    assert "self.num_attention_heads, 8.0, (self.attention_dp_rank + self.rank" in model
    assert "rotary_emb" not in model and "NF.flash_attention(" not in model


@pytest.mark.slow
def test_every_rank_with_the_first_ranks_slopes_fails_at_tp2(workdir, ported):
    wrong = workdir / "first_slopes" / "mpt"
    shutil.copytree(ported.package_dir, wrong)
    model = wrong / "model.py"
    text, count = re.subn(
        r"\(self\.attention_dp_rank \+ self\.rank \* self\.attention_dp_size\) \* self\.num_attention_heads_per_rank",
        "0",
        model.read_text(),
    )
    assert count == 1
    model.write_text(text)
    report = validate_model(wrong, ported.checkpoint_dir, tp=2, dtype="fp32", steps=4, config_variants=False)
    assert not report.equivalent
    assert report.first_diverging is not None and report.first_diverging.component == "layers.0.attention"
