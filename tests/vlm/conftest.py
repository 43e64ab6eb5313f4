"""A tiny Qwen3-VL checkpoint (validate/vision_tiny.py: a 3-layer text decoder
with M-RoPE sections [4, 2, 2], a 3-block vision tower with deep-stack taps
after blocks 0 and 1), built once per session in a temporary directory, and
the reference's host-side preprocessing module loaded alone (it needs only
torch)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "reference_models" / "qwen3_vl"


@pytest.fixture(scope="session")
def tiny_qwen3_vl(tmp_path_factory) -> Path:
    from autoport_cst.validate.vision_tiny import build_tiny_vlm_checkpoint

    return build_tiny_vlm_checkpoint(tmp_path_factory.mktemp("tiny-qwen3-vl"), seed=0)


@pytest.fixture(scope="session")
def preprocessing():
    spec = importlib.util.spec_from_file_location(
        "_qwen3_vl_preprocessing", REFERENCE / "vision_preprocessing.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def hf_qwen3_vl():
    """transformers' tiny Qwen3VLForConditionalGeneration (random weights)."""
    import torch
    from transformers import Qwen3VLForConditionalGeneration

    from autoport_cst.validate.vision_tiny import tiny_qwen3_vl_config

    torch.manual_seed(0)
    return Qwen3VLForConditionalGeneration(tiny_qwen3_vl_config()).eval()
