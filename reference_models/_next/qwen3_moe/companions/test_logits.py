# SPDX-License-Identifier: Apache-2.0
"""Logit test of the Qwen3-MoE port, on CPU.

The port and the transformers implementation are loaded with the same tiny
random weights (built from the architecture's config class, nothing is
downloaded) and must produce the same logits through prefill and decode,
within the tolerances of autoport-cst validation. Run from the root that holds
``vllm_neuron/``:

    python -m pytest test/vllm_neuron/model/<name>/test_logits.py

Needs ``autoport-cst[validate]``; without it the test is skipped, not passed.
"""

from pathlib import Path

import pytest

MODEL_NAME = "qwen3_moe"  # package under vllm_neuron/model/
HF_ARCHITECTURE = "Qwen3MoeForCausalLM"  # config.json architectures[0]
DECODE_STEPS = 16

pytest.importorskip("torch", reason="needs autoport-cst[validate]")
validate = pytest.importorskip("autoport_cst.validate", reason="needs autoport-cst[validate]")

PACKAGE = Path(__file__).resolve().parents[4] / "vllm_neuron" / "model" / MODEL_NAME


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    directory = tmp_path_factory.mktemp(MODEL_NAME)
    validate.build_tiny_checkpoint(HF_ARCHITECTURE, directory, seed=0)
    return directory


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_logits_match_transformers(checkpoint, dtype):
    report = validate.validate_model(PACKAGE, checkpoint, tp=1, dtype=dtype, steps=DECODE_STEPS)
    assert report.equivalent, report.summary()
