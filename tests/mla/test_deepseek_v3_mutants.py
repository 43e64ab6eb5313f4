"""The validation of the deepseek_v3 reference is not vacuous: copies broken
in one place of what makes DeepSeek-V3 what it is fail at TP=1 fp32 on the
tiny checkpoint (slow: one validation each)."""

from __future__ import annotations

import shutil

import pytest

from autoport_cst.validate import validate_model

from .conftest import REFERENCE

# name -> (text of model.py, its broken replacement)
MUTANTS = {
    "correction bias in the weights": (
        "weights = scores.gather(1, chosen)",
        "weights = (scores + self.e_score_correction_bias).gather(1, chosen)",
    ),
    "no group limit": (
        "scores, self.e_score_correction_bias, self.num_experts_per_token, self.n_group, self.topk_group",
        "scores, self.e_score_correction_bias, self.num_experts_per_token, 1, 1",
    ),
    "no routed scaling": (
        "weights = weights * self.routed_scaling_factor",
        "weights = weights * 1.0",
    ),
    "rotate-half for interleaved pairs": (
        "self.rope_interleave = config.rope_interleave",
        "self.rope_interleave = not config.rope_interleave",
    ),
    "latent cached before its norm": (
        "latent = self.kv_a_layernorm(latent)",
        "latent = latent",
    ),
    "latent split one column late": (
        "latent = self.kv_a_layernorm(latent)",
        "latent = self.kv_a_layernorm(compressed[..., 1 : self.kv_lora_rank + 1])",
    ),
    "decode values through the key half": (
        "values = NF.mla_absorb(latent_out[..., : self.kv_lora_rank], v_half.transpose(1, 2))",
        "values = NF.mla_absorb(latent_out[..., : self.kv_lora_rank], k_half.transpose(1, 2))",
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_a_broken_copy_does_not_validate(name, tiny_deepseek_v3, tmp_path):
    original, broken = MUTANTS[name]
    port = tmp_path / "deepseek_v3"
    shutil.copytree(REFERENCE, port)
    model = port / "model.py"
    source = model.read_text()
    assert source.count(original) == 1, original
    model.write_text(source.replace(original, broken))
    report = validate_model(port, tiny_deepseek_v3, steps=4, config_variants=False, parallel_layouts=False)
    assert not report.equivalent
    if name == "latent split one column late":  # named where it diverges: the KV latent
        assert report.first_diverging.component == "layers.0.kv_latent", report.first_diverging
