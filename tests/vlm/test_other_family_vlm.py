"""A vision-language model of another family, whose text decoder is one we
port (Gemma 3: Gemma3ForConditionalGeneration, a SigLIP tower): the vision
section cannot describe its tower (no Conv3d patch embedding, its blocks in
an encoder), so its spec names the tower as unsupported and ``plan`` refuses
it naming that, never a text-only plan of its decoder (it picked qwen3 and
exited 0 before)."""

from __future__ import annotations

import pytest

transformers = pytest.importorskip("transformers")


def tiny_gemma3_config():
    config = transformers.Gemma3Config(
        text_config=dict(
            vocab_size=300,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            max_position_embeddings=512,
            sliding_window=32,
        ),
        vision_config=dict(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            image_size=32,
            patch_size=8,
        ),
        mm_tokens_per_image=4,
        image_token_index=260,
        boi_token_index=258,
        eoi_token_index=259,
    )
    config.architectures = ["Gemma3ForConditionalGeneration"]
    return config


def test_the_siglip_tower_is_named_unsupported():
    from autoport_cst.research.vision import read_vision
    from autoport_cst.research.vlm import component_paths, meta_model, unread_tower

    config = tiny_gemma3_config()
    model = meta_model(config, "Gemma3ForConditionalGeneration", "tiny")
    paths = component_paths(model, config)
    vision, findings = read_vision(model, paths["tower"], paths["text"], paths)
    assert vision is None
    entry = unread_tower(model, paths, findings)
    assert entry.startswith("vision_tower: SiglipVisionModel at ")
    assert "no Conv3d patch embedding" in entry


@pytest.mark.slow
def test_plan_refuses_gemma3_naming_its_tower(tmp_path):
    from click.testing import CliRunner

    from autoport_cst.cli import cli
    from autoport_cst.validate.tiny import save_seeded_checkpoint

    checkpoint = tmp_path / "gemma3"
    save_seeded_checkpoint(checkpoint, transformers.Gemma3ForConditionalGeneration, tiny_gemma3_config(), 0)
    result = CliRunner().invoke(cli, ["plan", str(checkpoint), "-o", str(tmp_path / "plan.json")])
    assert result.exit_code == 1, result.output
    refusal = next(line for line in result.output.splitlines() if line.startswith("not portable"))
    assert "no reference realizes vision_tower" in refusal and "SiglipVisionModel" in refusal
