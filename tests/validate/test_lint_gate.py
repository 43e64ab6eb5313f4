"""``validate`` lints the port package with autoport-cst's hardware rules
before it runs anything (``validate.lint_gate``): a finding of error severity
fails it (exit 1) at stage ``lint``, named with its rule, position and fix, and
the JSON report carries every finding."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jsonschema
import pytest
from click.testing import CliRunner

from autoport_cst.validate import REPORT_SCHEMA, lint_gate, validate_model

ROOT = Path(__file__).resolve().parents[2]
QWEN3 = ROOT / "reference_models" / "qwen3"
GUARD = "validate_fp8_segmented_supported(self.k_cache.dtype in _FP8_DTYPES, fp8_packed=False)"
REFERENCES = sorted(p.parent for p in (ROOT / "reference_models").glob("*/model.py"))


@pytest.fixture(scope="module")
def tiny_qwen3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from autoport_cst.validate.tiny import build_tiny_checkpoint

    directory = tmp_path_factory.mktemp("lint-gate") / "tiny"
    build_tiny_checkpoint("Qwen3ForCausalLM", directory, seed=0)
    return directory


@pytest.fixture
def unguarded(tmp_path: Path) -> Path:
    """The qwen3 reference without its FP8 segmented-prefill guard (NRN009)."""
    port = tmp_path / "qwen3"
    shutil.copytree(QWEN3, port, ignore=shutil.ignore_patterns("__pycache__"))
    model = port / "model.py"
    text = model.read_text(encoding="utf-8")
    assert text.count(GUARD) == 1
    model.write_text(text.replace(GUARD, "pass"), encoding="utf-8")
    return port


def test_a_broken_hardware_rule_fails_before_anything_runs(unguarded: Path, tiny_qwen3: Path) -> None:
    report = validate_model(unguarded, tiny_qwen3, steps=2)
    assert not report.equivalent and report.exit_code == 1
    assert report.failure.stage == "lint"
    assert report.logits is None and report.components == [] and report.factory is None  # not run
    assert set(report.timings) == {"total"} and report.config_variants == report.parallel_layouts == []
    errors = lint_gate.failing(lint_gate.lint_findings(unguarded))
    assert errors and {d.code for d in errors} == {"NRN009"}
    for finding in errors:
        assert finding.path.endswith("model.py")
        assert f"{finding.path}:{finding.line}:{finding.column}: NRN009 fp8-segmented-guard: " in (
            report.failure.message
        )
    # NRN009's fix (fp8-segmented-guard, also a repair step of apply) is named
    assert report.failure.message.count("(the fp8-segmented-guard codemod)") == len(errors)
    assert report.summary().startswith("does not validate: the port breaks ")
    data = json.loads(report.to_json())
    jsonschema.validate(data, REPORT_SCHEMA)
    assert [(d["code"], d["line"], d["column"]) for d in data["lint"]] == [
        (d.code, d.line, d.column) for d in errors
    ]


def test_a_finding_with_a_codemod_names_the_lint_fix(tmp_path: Path) -> None:
    from autoport_cst.lint import Diagnostic, Fix

    finding = Diagnostic("p/model.py", 3, 5, "NRN004", "decode-bias-2d", "1-D bias", fix=Fix("unsqueeze"))
    unsafe = Diagnostic("p/model.py", 9, 1, "NRN005", "router-float32", "bf16", fix=Fix("f32", safe=False))
    assert lint_gate.how_to_fix(finding, "p") == "`autoport-cst lint --fix p` (the unsqueeze codemod)"
    assert lint_gate.how_to_fix(unsafe, "p").startswith("`autoport-cst lint --fix --unsafe-fixes p`")
    message = lint_gate.failure_message([finding], "p")
    assert message.splitlines() == [
        "the port breaks 1 Trainium hardware rule (autoport-cst lint; the port was not run):",
        "p/model.py:3:5: NRN004 decode-bias-2d: 1-D bias; fix: `autoport-cst lint --fix p` (the unsqueeze codemod)",
    ]


def test_warnings_are_reported_and_do_not_fail(tmp_path: Path) -> None:
    """Outside this repository (no NRN005 ``allow`` list) the MoE references'
    bf16 routers with float32 routing are warnings: kept in the report, not failing."""
    port = shutil.copytree(ROOT / "reference_models" / "qwen3_moe", tmp_path / "qwen3_moe")
    findings = lint_gate.lint_findings(port)
    assert [d.code for d in findings] == ["NRN005"] and findings[0].severity == "warning"
    assert lint_gate.failing(findings) == []


@pytest.mark.parametrize("reference", REFERENCES, ids=[p.name for p in REFERENCES])
def test_every_reference_passes_the_rules_where_it_is_and_copied_elsewhere(
    reference: Path, tmp_path: Path
) -> None:
    assert lint_gate.failing(lint_gate.lint_findings(reference)) == []
    copy = shutil.copytree(reference, tmp_path / reference.name, ignore=shutil.ignore_patterns("__pycache__"))
    assert lint_gate.failing(lint_gate.lint_findings(copy)) == []


def test_the_cli_says_it_does_not_validate_and_writes_the_findings(
    unguarded: Path, tiny_qwen3: Path, tmp_path: Path
) -> None:
    from autoport_cst.cli.validate_cmd import validate_command

    report_path = tmp_path / "report.json"
    result = CliRunner().invoke(
        validate_command,
        [str(unguarded), "--hf", str(tiny_qwen3), "--steps", "2", "--json", str(report_path)],
    )
    assert result.exit_code == 1, result.output
    assert "DOES NOT VALIDATE" in result.output and "NRN009 fp8-segmented-guard" in result.output
    data = json.loads(report_path.read_text(encoding="utf-8"))
    assert data["failure"]["stage"] == "lint" and {d["code"] for d in data["lint"]} == {"NRN009"}


def test_a_vision_language_port_is_linted_first_too(tmp_path: Path, monkeypatch) -> None:
    """``validate_vlm`` (``validate`` on a vision-language checkpoint) lints
    the package once the checkpoint's config is read, before any reference or
    port run."""
    from autoport_cst.validate import vision_validate
    from autoport_cst.validate.vision_tiny import build_tiny_vlm_checkpoint

    checkpoint = build_tiny_vlm_checkpoint(tmp_path / "tiny-vl", seed=0)
    port = shutil.copytree(
        ROOT / "reference_models" / "qwen3_vl",
        tmp_path / "qwen3_vl",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    model = port / "model.py"
    probe = "\n\nclass Probe(nn.Module):\n    def forward(self, x):\n        return x.item()\n"  # NRN003
    model.write_text(model.read_text(encoding="utf-8") + probe, encoding="utf-8")
    monkeypatch.setattr(vision_validate, "run_vision_reference", lambda *a, **k: pytest.fail("ran"))
    findings = lint_gate.failing(lint_gate.lint_findings(port))
    assert [d.code for d in findings] == ["NRN003"]
    report = vision_validate.validate_vlm(port, checkpoint, steps=2)
    assert not report.equivalent and report.failure_stage == "lint"
    assert report.summary().startswith("does not validate: the port breaks ")
    assert [d["code"] for d in report.lint] == [d.code for d in findings]
