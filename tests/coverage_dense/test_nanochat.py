"""NanoChat (issue 17): its rotate_half is ``cat((x2, -x1))``, each pair of
halves turned the other way, which equals the usual rotation of the head with
its halves swapped; its q/k norms are weightless RMSNorms of each head after
the rotation, and one weightless ``model.norm`` is applied twice, to the token
embeddings and to the last layer's output. Research reads the turn by running
the modeling code's rotation, the norms' width through the transposed view;
the port (llama3 with swapped-halves-rope, weightless q/k norms after RoPE, the
embedding norm, ReLU^2, the logit softcap) validates at TP=1 fp32/bf16 and
TP=2 and on its config variant, and a copy that loads the heads unswapped
fails at the first attention."""

from __future__ import annotations

import shutil

import pytest

from autoport_cst.port import port
from autoport_cst.research.pipeline import research
from autoport_cst.research.rotation_values import halves_turn
from autoport_cst.validate import build_tiny_checkpoint, validate_model
from autoport_cst.validate.reference import last_per_forward


@pytest.mark.parametrize(
    "model_type, turn", [("nanochat", "rotate_half_swapped"), ("llama", "rotate_half"), ("gptj", None)]
)
def test_the_turn_is_read_by_running_the_rotation(model_type, turn):
    module = f"transformers.models.{model_type}.modeling_{model_type}"
    assert halves_turn(module, "apply_rotary_pos_emb") == turn


def test_a_module_applied_twice_in_a_forward_is_recorded_at_its_last_application():
    entries = [(0, "embeddings normed"), (0, "final norm 0"), (1, "embeddings normed"), (1, "final norm 1")]
    assert last_per_forward(entries) == ["final norm 0", "final norm 1"]
    assert last_per_forward([(None, "a"), (None, "b")]) == ["b"]


def test_research_reads_the_turn_and_the_weightless_per_head_norms(tmp_path):
    build_tiny_checkpoint("NanoChatForCausalLM", tmp_path / "nanochat", seed=0)
    found = research(str(tmp_path / "nanochat"))
    spec = found.spec
    assert spec.rope.style == "rotate_half_swapped"
    attention = spec.attention
    assert (attention.qk_norm, attention.qk_norm_position, attention.qk_norm_affine) == (
        "per_head",
        "after_rope",
        False,
    )
    assert spec.embedding.norm and not found.unknown
    assert "k_norm(width 16), q_norm(width 16)" in found.decision("attention.qk_norm").evidence


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("nanochat")


@pytest.fixture(scope="module")
def ported(workdir):
    source = workdir / "nanochat"
    build_tiny_checkpoint("NanoChatForCausalLM", source, seed=0)
    return port(str(source), "nanochat", workdir / "ports", tp=2, force=True, steps=4)


@pytest.mark.slow
def test_nanochat_ports_and_validates(ported):
    assert ported.validated, [(r.tp, r.dtype, r.first_diverging) for r in ported.runs]
    assert [(r.tp, r.dtype) for r in ported.runs] == [(1, "fp32"), (1, "bf16"), (2, "fp32")]
    assert ported.variant_runs and all(r.equivalent for r in ported.variant_runs)
    assert {"swapped-halves-rope", "weightless-qk-norm", "qk-norm-position", "embedding-norm"} <= set(
        ported.steps
    )


@pytest.mark.slow
def test_heads_loaded_unswapped_fail_at_the_first_attention(workdir, ported):
    wrong = workdir / "unswapped" / "nanochat"
    shutil.copytree(ported.package_dir, wrong)
    model = wrong / "model.py"
    text = model.read_text()
    swap = "self.rope_column_order = _halves_swapped(self.rope_column_order)"
    assert text.count(swap) == 1
    model.write_text(text.replace(swap, "pass"))
    report = validate_model(wrong, ported.checkpoint_dir, tp=1, dtype="fp32", steps=4, config_variants=False)
    assert not report.equivalent
    assert report.first_diverging is not None and report.first_diverging.component == "layers.0.attention"
