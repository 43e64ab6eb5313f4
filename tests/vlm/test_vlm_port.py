"""``autoport-cst port`` on a vision-language checkpoint: research picks the
vision reference, the tiny checkpoint is a vision-language one, every run goes
through validate_vlm, and the port's generated logit test reruns them so."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("transformers")


@pytest.mark.slow
def test_port_of_a_tiny_qwen3_vl_validates_through_the_vision_language_validator(tmp_path):
    from autoport_cst.cli.validate_vlm_cmd import tiny_vision_language
    from autoport_cst.port import port

    source = tmp_path / "source"
    assert tiny_vision_language("Qwen3VLForConditionalGeneration", source, 0, {})
    outcome = port(str(source), "qwen3_vl", tmp_path / "out", steps=2)
    assert [(r.tp, r.dtype) for r in outcome.runs] == [(1, "fp32"), (1, "bf16")]
    assert all(r.equivalent for r in outcome.runs), [r.summary for r in outcome.runs]
    assert "vision-language" in outcome.runs[0].summary
    test_dir = tmp_path / "out" / "test" / "vllm_neuron" / "model" / "qwen3_vl"
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test_dir)],
        capture_output=True,
        text=True,
        cwd=tmp_path / "out",
    )
    assert result.returncode == 0, result.stdout[-2000:]
    assert "2 passed" in result.stdout
