"""The guard a default validation drives: a port with cache paths and an FP8
KV cache must refuse segmented prefill on a non-packed FP8 cache by its guard
(or validate); one that drops or weakens the guard (``validate_fp8_segmented_supported``
removed, or called with ``fp8_packed=True``) reaches the segmented kernel, which refuses
the cache itself: it validates, its guard entry naming the missing guard."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from autoport_cst.validate import guard_checks as G
from autoport_cst.validate.port_failure import is_port_refusal
from autoport_cst.validate.report import PortFailureInfo
from autoport_cst.validate.standin.prefill_attention import NON_PACKED_FP8

ROOT = Path(__file__).resolve().parents[2]
QWEN3 = ROOT / "reference_models" / "qwen3"
DEEPSEEK_V3 = ROOT / "reference_models" / "deepseek_v3"
GUARD = "validate_fp8_segmented_supported(self.k_cache.dtype in _FP8_DTYPES, fp8_packed=False)"


def test_only_a_port_with_cache_paths_and_an_fp8_cache_takes_the_run() -> None:
    assert G.has_fp8_cache_paths(QWEN3)
    assert not G.has_fp8_cache_paths(DEEPSEEK_V3)  # its cache holds latents


def test_the_apis_guard_refuses_on_the_ports_behalf() -> None:
    from autoport_cst.validate.standin.dtype_utils import validate_fp8_segmented_supported

    with pytest.raises(NotImplementedError) as raised:
        validate_fp8_segmented_supported(True, fp8_packed=False)
    assert is_port_refusal(raised.value)
    assert not is_port_refusal(NotImplementedError("no traceback"))


class _Found:
    def __init__(self, equivalent: bool, failure: PortFailureInfo | None = None) -> None:
        self.equivalent, self.failure = equivalent, failure

    def summary(self) -> str:
        return "equivalent" if self.equivalent else "failed"


class _Report(_Found):
    def __init__(self) -> None:
        super().__init__(True)
        self.config_variants: list[dict] = []
        self.failed_as: str | None = None
        self.settings = {"prefill_calls": [{"kind": "whole"}, {"kind": "chunked"}]}

    def fail_as(self, named: str, found: _Found) -> None:
        self.equivalent, self.failed_as = False, named


@pytest.mark.parametrize(
    ("found", "fails"),
    [
        (_Found(False, PortFailureInfo("prefill", "NotImplementedError: packed only", True)), False),
        (_Found(True), False),  # a port that packs its FP8 cache
        (_Found(False, PortFailureInfo("prefill", "KernelConstraintError: shape (2, 3)", False)), True),
        # no guard: the segmented kernel itself refuses the non-packed FP8 cache (it asserts on the device)
        (
            _Found(
                False, PortFailureInfo("prefill", f"KernelConstraintError: NF.x: {NON_PACKED_FP8}", False)
            ),
            False,
        ),
        (_Found(False), True),  # it ran and diverged
    ],
)
def test_a_refusal_or_a_validating_run_passes_anything_else_fails(found: _Found, fails: bool) -> None:
    asked: list[dict] = []

    def validate(**options: object) -> _Found:
        asked.append(options)
        return found

    report = _Report()
    G.check_fp8_segmented_guard(report, QWEN3, validate)
    assert asked == [{"kv_cache_dtype": "fp8", "prefill": "segmented"}]
    (entry,) = report.config_variants
    assert entry["label"] == G.LABEL and (report.failed_as is not None) is fails


def _without_guard(tmp_path: Path, replacement: str) -> Path:
    port = tmp_path / "port"
    shutil.copytree(QWEN3, port, ignore=shutil.ignore_patterns("__pycache__"))
    model = port / "model.py"
    text = model.read_text(encoding="utf-8")
    assert text.count(GUARD) == 1
    model.write_text(text.replace(GUARD, replacement), encoding="utf-8")
    return port


@pytest.mark.slow
@pytest.mark.parametrize(
    ("replacement", "rule"),
    [("pass", "NRN009"), (GUARD.replace("fp8_packed=False", "fp8_packed=True"), None)],
)
def test_a_dropped_or_weakened_guard_leaves_the_refusal_to_the_kernel(
    tmp_path: Path, replacement: str, rule: str | None
) -> None:
    """Without the guard the segmented kernel refuses the non-packed FP8 cache itself (on the
    device, an assertion instead of a clear message): no wrong attention, so the run passes
    and the guard run's entry names the missing guard. A dropped guard breaks the lint rule
    NRN009, so ``validate`` fails it before any run (``lint_gate``); a weakened one passes the
    rule, which does not judge the guard's arguments."""
    from autoport_cst.validate import validate_model
    from autoport_cst.validate.tiny import build_tiny_checkpoint

    tiny = tmp_path / "tiny"
    build_tiny_checkpoint("Qwen3ForCausalLM", tiny, seed=0)
    report = validate_model(QWEN3, tiny, steps=4, parallel_layouts=False)
    assert report.equivalent, report.summary()
    (entry,) = [e for e in report.config_variants if e["label"] == G.LABEL]
    assert entry["equivalent"] is True and entry["summary"].startswith("refused"), entry
    port = _without_guard(tmp_path, replacement)
    linted = validate_model(port, tiny, steps=4, parallel_layouts=False)
    if rule is not None:
        assert linted.exit_code == 1 and linted.failure.stage == "lint", linted.summary()
        assert f"{rule} fp8-segmented-guard" in linted.failure.message
    mutant = (
        linted if rule is None else validate_model(port, tiny, steps=4, parallel_layouts=False, lint=False)
    )
    assert mutant.exit_code == 0, mutant.summary()
    (entry,) = [e for e in mutant.config_variants if e["label"] == G.LABEL]
    assert entry["equivalent"] is True and entry["summary"].startswith("refused by the kernel"), entry
    assert "validate_fp8_segmented_supported" in entry["summary"]


def test_a_port_whose_plain_run_took_no_cache_paths_is_not_asked() -> None:
    report = _Report()
    report.settings = {"prefill_calls": [{"kind": "whole"}] * 3}
    G.check_fp8_segmented_guard(report, QWEN3, lambda **options: pytest.fail("asked"))
    assert report.config_variants == [] and report.failed_as is None
