"""The FP8 KV-cache run of a default validation: a port that reads KV-cache
scales is validated with an FP8 cache on a copy of its checkpoint with
distinct ``k_scale`` / ``v_scale`` per layer, so one with its scales swapped
(a survivor of the mutation benchmark, qwen3's ``attention_decode`` call) fails
``validate`` as run by default."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest

from autoport_cst.validate import kv_scale_variant as KV

ROOT = Path(__file__).resolve().parents[2]
QWEN3 = ROOT / "reference_models" / "qwen3"
DEEPSEEK_V3 = ROOT / "reference_models" / "deepseek_v3"


@pytest.fixture(scope="module")
def tiny_qwen3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from autoport_cst.validate.tiny import build_tiny_checkpoint

    base = tmp_path_factory.mktemp("kv-scales") / "tiny"
    build_tiny_checkpoint("Qwen3ForCausalLM", base, seed=0)
    return base


def test_scales_differ_per_tensor_and_from_layer_to_layer() -> None:
    pairs = [KV.layer_scales(layer) for layer in range(4)]
    assert len(set(pairs)) == 4 and all(k != v for k, v in pairs)
    assert all(k == 2.0 ** round(math.log2(k)) and k > 1 for pair in pairs for k in pair)


def test_the_scales_go_beside_each_attentions_projections(tiny_qwen3: Path, tmp_path: Path) -> None:
    from autoport_cst.validate.fp8_reference import checkpoint_kv_scales

    modules = KV.attention_modules(tiny_qwen3)
    assert modules == {0: "model.layers.0.self_attn", 1: "model.layers.1.self_attn"}  # not the norms
    scaled = KV.scaled_checkpoint(tiny_qwen3, tmp_path / "scaled", modules)
    found = checkpoint_kv_scales(scaled)
    assert found[(1, "k_scale")] == KV.layer_scales(1)[0]
    assert found[(0, "v_scale")] == KV.layer_scales(0)[1]


def test_only_a_port_that_reads_kv_scales_takes_the_run() -> None:
    assert KV.reads_kv_scales(QWEN3)
    assert not KV.reads_kv_scales(DEEPSEEK_V3)  # its cache holds latents


class _Found:
    def __init__(self, equivalent: bool, text: str) -> None:
        self.equivalent, self.failure, self.text = equivalent, None, text

    def summary(self) -> str:
        return self.text


class _Report(_Found):
    def __init__(self) -> None:
        super().__init__(True, "equivalent")
        self.config_variants: list[dict] = []
        self.failed_as: str | None = None

    def fail_as(self, named: str, found: _Found) -> None:
        self.equivalent, self.failed_as = False, named


@pytest.mark.parametrize("equivalent", [True, False])
def test_one_run_on_the_validations_prompts_decides(tiny_qwen3: Path, equivalent: bool) -> None:
    """No run again on other prompts: the transformers cache is teacher-forced
    from the port's at FP8 rounding boundaries (fp8_cache_forcing), so the
    one run at the fp32 bound is the verdict."""
    seeds: list[int] = []

    def validate(checkpoint: Path, seed: int) -> _Found:
        assert (checkpoint / "model.safetensors").is_file()
        seeds.append(seed)
        return _Found(equivalent, f"seed {seed}")

    report = _Report()
    KV.check_kv_scale_variant(report, QWEN3, tiny_qwen3, validate, seed=2)
    assert seeds == [2]
    (entry,) = report.config_variants
    assert entry["equivalent"] is equivalent and (report.failed_as is None) is equivalent
    assert entry["summary"] == "seed 2"


@pytest.mark.parametrize(
    ("architecture", "module"),
    [
        ("GPTJForCausalLM", "transformer.h.{}.attn"),
        ("CodeGenForCausalLM", "transformer.h.{}.attn"),
        ("GPTNeoXForCausalLM", "gpt_neox.layers.{}.attention"),
    ],
)
def test_the_attention_module_is_read_off_the_checkpoint(
    architecture: str, module: str, tmp_path: Path
) -> None:
    """GPT-J and CodeGen keep their layers under transformer.h and name the
    attention attn: the scales go there, and the FP8 baseline reads them back."""
    from autoport_cst.validate.fp8_reference import checkpoint_kv_scales
    from autoport_cst.validate.tiny import build_tiny_checkpoint

    build_tiny_checkpoint(architecture, tmp_path / "tiny", seed=0)
    modules = KV.attention_modules(tmp_path / "tiny")
    assert modules == {0: module.format(0), 1: module.format(1)}
    scaled = KV.scaled_checkpoint(tmp_path / "tiny", tmp_path / "scaled", modules)
    assert checkpoint_kv_scales(scaled) == {
        (layer, name): scale
        for layer in (0, 1)
        for name, scale in zip(("k_scale", "v_scale"), KV.layer_scales(layer), strict=True)
    }


def test_the_decoder_layer_list_is_the_one_the_config_counts(tmp_path: Path) -> None:
    """A vision tower's blocks hold attention modules too: the decoder's list
    is the one indexed by the config's text layers."""
    import json

    import torch
    from safetensors.torch import save_file

    tensors = {f"model.visual.blocks.{i}.attn.qkv.weight": torch.zeros(2, 2) for i in range(3)}
    tensors |= {
        f"model.language_model.layers.{i}.self_attn.q_proj.weight": torch.zeros(2, 2) for i in range(2)
    }
    save_file(tensors, str(tmp_path / "model.safetensors"))
    config = {"text_config": {"num_hidden_layers": 2}, "vision_config": {"depth": 3}}
    (tmp_path / "config.json").write_text(json.dumps(config), encoding="utf-8")
    assert KV.attention_modules(tmp_path) == {
        0: "model.language_model.layers.0.self_attn",
        1: "model.language_model.layers.1.self_attn",
    }


def _swapped(tmp_path: Path) -> Path:
    port = tmp_path / "port"
    shutil.copytree(QWEN3, port, ignore=shutil.ignore_patterns("__pycache__"))
    model = port / "model.py"
    text = model.read_text(encoding="utf-8")
    anchor = "            k_scale=self.k_scale,\n            v_scale=self.v_scale,\n"
    assert text.count(anchor) == 1
    swapped = "            k_scale=self.v_scale,\n            v_scale=self.k_scale,\n"
    model.write_text(text.replace(anchor, swapped), encoding="utf-8")
    return port


@pytest.mark.slow
def test_default_validation_runs_the_fp8_cache_and_catches_swapped_scales(
    tiny_qwen3: Path, tmp_path: Path
) -> None:
    from autoport_cst.validate import validate_model

    report = validate_model(QWEN3, tiny_qwen3, steps=4, parallel_layouts=False)
    assert report.equivalent, report.summary()
    (entry,) = [e for e in report.config_variants if e["label"] == KV.LABEL]
    assert entry["equivalent"] is True, entry
    mutant = validate_model(_swapped(tmp_path), tiny_qwen3, steps=4, parallel_layouts=False)
    assert mutant.exit_code == 1
    assert KV.LABEL in mutant.summary()
    assert (mutant.first_diverging.component, mutant.first_diverging.phase) == (
        "layers.0.attention",
        "decode",
    )
