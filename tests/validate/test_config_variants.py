"""The config variants a port's reference declares are validated by default
(TP=1 fp32), each on a checkpoint whose variant parameters matter."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from autoport_cst.validate import config_variants as CV

ROOT = Path(__file__).resolve().parents[2]
QWEN3 = ROOT / "reference_models" / "qwen3"

BASE = {
    "architectures": ["Qwen3ForCausalLM"],
    "head_dim": 16,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "layer_types": ["full_attention", "full_attention"],
    "sliding_window": None,
    "use_sliding_window": False,
    "max_window_layers": 28,
    "max_position_embeddings": 512,
    "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
    "tie_word_embeddings": False,
}


def _labels(base: dict, key_format: str = "model") -> list[str]:
    return [v.label for v in CV.declared_variants(QWEN3, base, key_format) if v.values is not None]


def test_every_declared_value_the_checkpoint_lacks_is_a_variant() -> None:
    assert _labels(BASE) == [
        'rope.type="llama3"',
        'rope.type="yarn"',
        'rope.type="yarn" (not truncated)',
        "embedding.tied=true",
        'attention.sliding_window="per_layer"',
    ]


def test_a_window_the_architecture_lacks_is_skipped_with_a_reason() -> None:
    base = {k: v for k, v in BASE.items() if k not in ("sliding_window", "layer_types")}
    variants = {v.label: v for v in CV.declared_variants(QWEN3, base, "model")}
    assert variants['attention.sliding_window="per_layer"'].values is None
    assert "no config edit" in (variants['attention.sliding_window="per_layer"'].skipped or "")


def test_window_none_keeps_the_window_of_a_model_that_always_reads_it() -> None:
    base = {**BASE, "layer_types": ["sliding_attention", "full_attention"], "sliding_window": 6}
    edits = CV._window_edits("none", base)
    assert edits == [("", {"layer_types": ["full_attention", "full_attention"]})]


def _wavelengths(theta: float, dims: int) -> list[float]:
    return [2 * math.pi * theta ** (2 * i / dims) for i in range(dims // 2)]


@pytest.mark.parametrize("theta", [10000.0, 1e6])
def test_llama3_variant_puts_a_frequency_in_every_band(theta: float) -> None:
    p = CV.llama3_parameters(theta, 16)
    original = p["original_max_position_embeddings"]
    high, low = original / p["high_freq_factor"], original / p["low_freq_factor"]
    waves = _wavelengths(theta, 16)
    assert any(w < high for w in waves) and any(w > low for w in waves)
    assert any(high <= w <= low for w in waves)
    assert original < 512  # under the tiny context


def _yarn_band(p: dict, theta: float, dims: int, beta_fast: float, beta_slow: float) -> tuple[float, float]:
    def dim(beta: float) -> float:
        return (
            dims
            * math.log(p["original_max_position_embeddings"] / (beta * 2 * math.pi))
            / (2 * math.log(theta))
        )

    return dim(beta_fast), dim(beta_slow)


@pytest.mark.parametrize("theta", [10000.0, 1e6, 150000.0])
def test_yarn_band_lies_inside_the_frequencies_so_its_betas_matter(theta: float) -> None:
    """At the tiny head_dim the default-looking 128 original positions put
    both band edges at 0: beta_fast changed nothing."""
    p = CV.yarn_parameters(theta, 16)
    low, high = _yarn_band(p, theta, 16, 32.0, 1.0)
    assert 0 < math.floor(low) < math.ceil(high) < 16 // 2 - 1
    moved, _ = _yarn_band(p, theta, 16, 33.0, 1.0)
    assert moved != low  # untruncated, any other beta_fast moves the band


@pytest.mark.slow
def test_a_wrong_yarn_default_fails_on_its_variant(tmp_path: Path) -> None:
    from autoport_cst.validate import validate_model
    from autoport_cst.validate.tiny import build_tiny_checkpoint

    checkpoint = tmp_path / "tiny"
    build_tiny_checkpoint("Qwen3ForCausalLM", checkpoint, seed=0)
    port = tmp_path / "port"
    shutil.copytree(QWEN3, port, ignore=shutil.ignore_patterns("__pycache__"))
    model = port / "model.py"
    text = model.read_text(encoding="utf-8")
    anchor = 'scaling.get("beta_fast") or 32'
    assert text.count(anchor) == 1
    model.write_text(text.replace(anchor, 'scaling.get("beta_fast") or 33'), encoding="utf-8")
    report = validate_model(port, checkpoint, steps=2)
    assert report.exit_code == 1
    assert report.first_diverging is not None
    assert report.first_diverging.message.startswith('config variant rope.type="yarn" (not truncated): ')
    assert any(v["equivalent"] is False for v in report.config_variants)
    # the default checkpoint alone does not see it
    assert validate_model(port, checkpoint, steps=2, config_variants=False).equivalent


@pytest.mark.slow
def test_the_reference_validates_on_every_variant(tmp_path: Path) -> None:
    from autoport_cst.validate import validate_model
    from autoport_cst.validate.tiny import build_tiny_checkpoint

    checkpoint = tmp_path / "tiny"
    build_tiny_checkpoint("Qwen3ForCausalLM", checkpoint, seed=0)
    report = validate_model(QWEN3, checkpoint, steps=2)
    assert report.equivalent, report.summary()
    # a run per declared variant the checkpoint's architecture can express (and the FP8 KV-cache
    # runs after them), every one equivalent
    base = json.loads((checkpoint / "config.json").read_text(encoding="utf-8"))
    declared = {v.label for v in CV.declared_variants(QWEN3, base, "model") if v.values is not None}
    assert declared and declared <= {v["label"] for v in report.config_variants}
    assert all(v["equivalent"] for v in report.config_variants), report.config_variants


def test_a_variant_of_another_feature_keeps_the_checkpoints_key_format() -> None:
    """A checkpoint written with the hub's names (``save_pretrained``) gets
    variants with the hub's names: only the declared feature differs (a port
    planned on GraniteMoE's hub keys failed every RoPE variant at load)."""
    variants = [v for v in CV.declared_variants(QWEN3, BASE, "saved") if v.values is not None]
    assert variants and {v.key_format for v in variants} == {"saved"}


def _moe_package(tmp_path: Path, planned: str) -> Path:
    manifest = {
        "spec": {"checkpoint": {"gate_up": planned}},
        "config_driven": {"checkpoint.gate_up": ["separate", "fused"]},
    }
    (tmp_path / "reference.json").write_text(json.dumps(manifest), encoding="utf-8")
    return tmp_path


@pytest.mark.parametrize(
    ("planned", "key_format", "expected"),
    [
        ("fused", "model", [('checkpoint.gate_up="separate"', "saved")]),
        # GraniteMoE's hub checkpoint stacks its experts: the other key format is no other layout
        ("fused", "saved", [('checkpoint.gate_up="separate"', "model")]),
        ("separate", "saved", [('checkpoint.gate_up="fused"', "model")]),
    ],
)
def test_the_other_expert_layout_is_the_one_the_port_was_not_planned_on(
    tmp_path, planned, key_format, expected
):
    variants = CV.declared_variants(_moe_package(tmp_path, planned), BASE, key_format)
    assert [(v.label, v.key_format) for v in variants] == expected
    assert [v.layout for v in variants] == [label.split("=")[1].strip('"') for label, _ in expected]


def test_expert_layout_is_read_from_the_checkpoints_names(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    one = torch.zeros(1)
    save_file({"model.layers.0.mlp.experts.3.gate_proj.weight": one}, str(tmp_path / "model.safetensors"))
    assert CV.expert_layout(tmp_path) == "separate"
    save_file(
        {"model.layers.0.block_sparse_moe.input_linear.weight": one}, str(tmp_path / "model.safetensors")
    )
    assert CV.expert_layout(tmp_path) == "fused"


@pytest.mark.parametrize(
    ("planned", "layout", "expected"),
    [
        # Mixtral's port is planned on per-expert hub keys; the default tiny checkpoint stacks them
        ("separate", "fused", [('checkpoint.gate_up="separate"', "saved")]),
        ("fused", "separate", [('checkpoint.gate_up="fused"', "model")]),
    ],
)
def test_the_other_expert_layout_is_the_one_the_checkpoint_does_not_have(tmp_path, planned, layout, expected):
    """The layout read from the checkpoint's names decides, not the one the
    port was planned on: a port planned per-expert and validated on a stacked
    checkpoint must load per-expert tensors too (its per-expert loader ran in
    no default validation)."""
    key_format = "saved" if layout == "separate" else "model"
    variants = CV.declared_variants(_moe_package(tmp_path, planned), BASE, key_format, layout)
    assert [(v.label, v.key_format) for v in variants] == expected
