"""Validations of one checkpoint share the transformers run while
``reusing_reference_runs`` is active (what ``port`` does for its fp32 and
bf16 runs), with the same reports; outside it, or on changed checkpoint
files, transformers runs again."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from autoport_cst.validate import api, validate_model
from autoport_cst.validate.reference_reuse import reusing_reference_runs


@pytest.fixture
def loads(monkeypatch) -> dict[Path, list[str]]:
    """The dtypes transformers' model is loaded in, in order, by checkpoint
    (a passing fp32 run validates its reference's config variants too, on
    checkpoints of their own)."""
    seen: dict[Path, list[str]] = {}
    original = api.load_reference

    def counted(checkpoint, dtype, *args, **kwargs):
        seen.setdefault(Path(checkpoint).resolve(), []).append(str(dtype))
        return original(checkpoint, dtype, *args, **kwargs)

    monkeypatch.setattr(api, "load_reference", counted)
    return seen


def _verdict(report) -> tuple:
    return (report.equivalent, report.first_diverging, report.failed_checks, report.logits, report.components)


def test_the_second_run_on_a_checkpoint_reuses_the_reference(llama3_dir: Path, tiny_llama: Path, loads):
    alone = validate_model(llama3_dir, tiny_llama, dtype="bf16", steps=4)
    assert loads[tiny_llama.resolve()] == ["torch.float32", "torch.bfloat16"]
    loads.clear()
    with reusing_reference_runs():
        # (its follow-ups, which reuse the reference too: test_validate_llama3's fp32_report)
        validate_model(
            llama3_dir, tiny_llama, dtype="fp32", steps=4, config_variants=False, parallel_layouts=False
        )
        reused = validate_model(llama3_dir, tiny_llama, dtype="bf16", steps=4)
    assert loads[tiny_llama.resolve()] == ["torch.float32", "torch.bfloat16"]  # once, for both runs
    assert _verdict(reused) == _verdict(alone)


def test_changed_files_or_other_steps_run_transformers_again(
    llama3_dir: Path, tiny_llama: Path, tmp_path: Path, loads
):
    checkpoint = Path(shutil.copytree(tiny_llama, tmp_path / "tiny"))
    with reusing_reference_runs():
        validate_model(llama3_dir, checkpoint, dtype="bf16", steps=2)
        validate_model(llama3_dir, checkpoint, dtype="bf16", steps=3)  # other steps
        weights = checkpoint / "model.safetensors"
        stat = weights.stat()
        os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))  # rewritten
        validate_model(llama3_dir, checkpoint, dtype="bf16", steps=2)
    assert len(loads[checkpoint.resolve()]) == 6
    validate_model(llama3_dir, checkpoint, dtype="bf16", steps=2)  # outside: nothing kept
    assert len(loads[checkpoint.resolve()]) == 8
