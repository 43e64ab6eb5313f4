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


QWEN_VL_ARCHITECTURES = (
    "Qwen3VLForConditionalGeneration",
    "Qwen2_5_VLForConditionalGeneration",
    "Qwen2VLForConditionalGeneration",
)


@pytest.fixture(scope="session", params=QWEN_VL_ARCHITECTURES)
def hf_qwen_vl(request):
    """transformers' tiny model of a Qwen vision-language architecture (random weights)."""
    import torch
    import transformers

    from autoport_cst.validate.vision_tiny import tiny_vlm_config

    torch.manual_seed(0)
    return getattr(transformers, request.param)(tiny_vlm_config(request.param)).eval()
