"""The validator checks a port's op-by-op attention substitutes against the
kernels they stand for (``validate.kernel_substitutes``): a Gemma 2 port
edited wrongly where its own calls never go (a one-KV-head cache, keys
longer than the queries, a zero-padded hidden size) validated on its model run alone; it now fails,
naming the substitute and the case."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoport_cst.validate import validate_model
from autoport_cst.validate.kernel_substitutes import CHECK
from tests.edited_copies import edited_copy

from .test_validations import CASES

# the Gemma 2 case of the attention validations: its tiny checkpoint bites on softcapping
GEMMA2 = next(case for case in CASES if case.id == "gemma2")


@pytest.fixture(scope="module")
def gemma2(port_builder, tiny_checkpoint):
    return port_builder(GEMMA2.plan), tiny_checkpoint(GEMMA2.checkpoint)


def _mutated(package: Path, tmp_path: Path, old: str, new: str) -> Path:
    return edited_copy(package, tmp_path / package.name, [(old, new)])


def test_the_port_validates_with_its_substitutes_checked(gemma2):
    package, checkpoint = gemma2
    report = validate_model(package, checkpoint, dtype="fp32", steps=4)
    assert report.equivalent, report.summary()
    assert report.settings["kernel_substitutes"] == "checked against the stand-in kernels"
    # its FP8 KV cache runs through the op-by-op decode's step quantization (refused before)
    fp8 = [v for v in report.config_variants if v["label"].startswith("kv_cache_dtype=fp8 (")]
    assert [v["equivalent"] for v in fp8] == [True], fp8


def test_an_fp8_cache_written_wrongly_at_prefill_fails_on_the_fp8_run(gemma2, tmp_path):
    """The prefill's cache write clamps the scaled K to [max, max]: only an
    FP8 cache takes that branch, which the op-by-op decode refused before."""
    package, checkpoint = gemma2
    old = "k_rows = (k_rows * self.k_scale).clamp(-FP8_CLAMP_MAX, FP8_CLAMP_MAX)"
    report = validate_model(
        _mutated(package, tmp_path, old, old.replace("(-FP8", "(FP8")), checkpoint, dtype="fp32", steps=4
    )
    assert not report.equivalent
    assert report.summary().startswith("not equivalent: config variant kv_cache_dtype=fp8"), report.summary()


@pytest.mark.parametrize(
    "old, new, named",
    [
        (
            "cache_view = V_cache if V_cache.dim() == 4 else V_cache.unsqueeze(1)",
            "cache_view = V_cache if V_cache.dim() == 4 else V_cache.unsqueeze(2)",
            "_attention_decode_unfused differs from NF.attention_decode on 3d_cache",
        ),
        (
            "q_pos = torch.arange(seq_q, device=q.device).unsqueeze(1) + (seq_k - seq_q)",
            "q_pos = torch.arange(seq_q, device=q.device).unsqueeze(1) - (seq_k - seq_q)",
            "_flash_attention_unfused differs from NF.flash_attention on 5 queries over 9 keys",
        ),
        (  # the port passes its hidden size unpadded: only a padded one takes this branch
            "x32.pow(2).sum(-1, keepdim=True) / width",
            "x32.pow(2).sum(-1, keepdim=True) / x32.shape[-1]",
            "_attention_decode_unfused differs from NF.attention_decode on fused input norm over a zero-padded",
        ),
        (  # the token axis read for the hidden one: differs only at a real width equal to the tokens
            "if width in (None, x32.shape[-1])",
            "if width in (None, x32.shape[-2])",
            "X_hidden_dim_actual 2 of 32, 2 tokens a step",
        ),
        (  # the fused input norm's default epsilon: the port passes its own
            "1e-3 if rmsnorm_X_eps is None",
            "0.002 if rmsnorm_X_eps is None",
            "on fused input norm at the default epsilon",
        ),
        (  # the QK norm after RoPE: no port of ours enables it
            "k = rms_norm(k, rmsnorm_QK_post_rope_eps, rmsnorm_QK_post_rope_W_K)",
            "k = rms_norm(k, rmsnorm_QK_post_rope_eps, rmsnorm_QK_post_rope_W_Q)",
            "on post_rope_qk_norm",
        ),
    ],
)
def test_a_substitute_wrong_where_the_port_never_calls_it_fails(gemma2, tmp_path, old, new, named):
    package, checkpoint = gemma2
    report = validate_model(_mutated(package, tmp_path, old, new), checkpoint, dtype="fp32", steps=4)
    assert not report.equivalent
    assert report.failure is not None and report.failure.stage == CHECK
    assert named in report.failure.message
    # the model run itself still matches: only the new check sees the edit
    assert report.first_diverging is None
