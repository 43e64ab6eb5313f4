"""The FP8 KV-cache baseline: transformers with its K/V rounded through FP8
where the port's cache rounds them, so a correct FP8 port validates and one
with its scales swapped fails."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from autoport_cst.validate import fp8_reference as F8

ROOT = Path(__file__).resolve().parents[2]
QWEN3 = ROOT / "reference_models" / "qwen3"
SCALES = {0: (0.06, 0.011), 1: (0.12, 0.022)}  # per layer (k_scale, v_scale): distinct


def test_rounding_is_fp8_of_the_scaled_value() -> None:
    x = torch.tensor([0.1, -0.37, 1.9, 1000.0])
    assert torch.equal(F8.fp8_rounded(x, 1.0), x.to(torch.float8_e4m3fn).float().clamp(-1000, 240))
    scaled = F8.fp8_rounded(x[:3], 0.01)
    assert not torch.equal(scaled, F8.fp8_rounded(x[:3], 1.0))
    assert torch.allclose(scaled, x[:3], rtol=0.07)  # three mantissa bits


def _with_scales(source: Path, target: Path) -> Path:
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    shutil.copytree(source, target)
    path = target / "model.safetensors"
    with safe_open(str(path), framework="pt") as handle:
        metadata = handle.metadata()
    state = load_file(str(path))
    for layer, (k, v) in SCALES.items():
        state[f"model.layers.{layer}.self_attn.k_scale"] = torch.tensor([k])
        state[f"model.layers.{layer}.self_attn.v_scale"] = torch.tensor([v])
    save_file(state, str(path), metadata=metadata)
    return target


@pytest.fixture(scope="module")
def scaled_qwen3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from autoport_cst.validate.tiny import build_tiny_checkpoint

    base = tmp_path_factory.mktemp("fp8") / "tiny"
    build_tiny_checkpoint("Qwen3ForCausalLM", base, seed=0)
    return _with_scales(base, base.parent / "scaled")


def test_scales_are_read_per_layer(scaled_qwen3: Path) -> None:
    found = F8.checkpoint_kv_scales(scaled_qwen3)
    assert found[(1, "v_scale")] == pytest.approx(0.022)
    assert found[(0, "k_scale")] == pytest.approx(0.06)


@pytest.mark.slow
def test_the_reference_validates_with_an_fp8_cache(scaled_qwen3: Path) -> None:
    from autoport_cst.validate import validate_model

    report = validate_model(QWEN3, scaled_qwen3, steps=4, kv_cache_dtype="fp8")
    assert report.equivalent, report.summary()


@pytest.mark.slow
def test_swapped_kv_scales_fail(scaled_qwen3: Path, tmp_path: Path) -> None:
    from autoport_cst.validate import validate_model

    port = tmp_path / "port"
    shutil.copytree(QWEN3, port, ignore=shutil.ignore_patterns("__pycache__"))
    model = port / "model.py"
    text = model.read_text(encoding="utf-8")
    anchor = "            k_scale=self.k_scale,\n            v_scale=self.v_scale,\n"
    assert text.count(anchor) == 1
    model.write_text(
        text.replace(anchor, "            k_scale=self.v_scale,\n            v_scale=self.k_scale,\n"),
        encoding="utf-8",
    )
    report = validate_model(port, scaled_qwen3, steps=4, kv_cache_dtype="fp8")
    assert report.exit_code == 1
    assert (report.first_diverging.component, report.first_diverging.phase) == (
        "layers.0.attention",
        "decode",
    )
