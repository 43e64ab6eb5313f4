"""A reference whose segmented prefill kernel has no FP8 guard (NRN009; the
real vllm_neuron qwen3 is one) gets ``fp8-segmented-guard`` as a repair step
of every port: before it, each port written from it failed ``validate``'s lint
gate on its reference's error."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from autoport_cst.reference_models import builtin_references

from autoport_cst.apply import build_port, load_reference
from autoport_cst.apply.composer import repairs
from autoport_cst.lint import lint_source
from autoport_cst.plan import load_plan

GUARD = "validate_fp8_segmented_supported("


def _unguarded(name: str, into: Path) -> Path:
    """A copy of the built-in reference ``name`` without its guard calls."""
    target = into / name
    shutil.copytree(builtin_references()[name], target, ignore=shutil.ignore_patterns("__pycache__"))
    model = target / "model.py"
    lines = model.read_text(encoding="utf-8").splitlines(keepends=True)
    kept = [line for line in lines if not line.strip().startswith(GUARD)]
    assert len(kept) < len(lines)
    model.write_text("".join(kept), encoding="utf-8")
    return target


@pytest.mark.parametrize("name", sorted(builtin_references()))
def test_no_reference_of_ours_needs_a_repair(name):
    """Every repair rule (NRN006-NRN010) holds on our references."""
    assert repairs(load_reference(name)) == []


def test_an_unguarded_reference_gets_the_guard_in_every_port(tmp_path, repo_root):
    directory = _unguarded("llama3", tmp_path)
    reported = [
        d for d in lint_source((directory / "model.py").read_text(), "model.py") if d.code == "NRN009"
    ]
    assert reported, "the copy breaks NRN009"
    reference = load_reference(str(directory))
    assert "fp8-segmented-guard" in repairs(reference)

    result = build_port(load_plan(repo_root / "examples" / "qwen2.plan.json"), reference)
    assert result.ok, result.failure
    assert ("fp8-segmented-guard", "repair") in [(s.codemod, s.origin) for s in result.steps]
    model = result.files[f"{result.package_dir}/model.py"]
    assert [d for d in lint_source(model, "model.py") if d.code == "NRN009"] == []
    # one guard before each kernel call the rule reported, on that call's own cache
    assert model.count(GUARD) == len(reported)
    assert model.count(
        f"{GUARD}self.k_cache.dtype in (torch.float8_e4m3fn, torch.float8_e5m2), fp8_packed=False)"
    ) == len(reported)
    compile(model, "model.py", "exec")
