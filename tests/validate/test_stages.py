"""A validation reports its stages in the documented order (the reference
runs while the port loads, then the port runs), and the port's in-memory
output is a field of the report that the JSON report leaves out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autoport_cst.validate import validate_model
from autoport_cst.validate.api import STAGES


def test_stages_in_order_and_the_port_output_stays_out_of_the_json(
    llama3_dir: Path, tiny_llama: Path
) -> None:
    stages: list[str] = []
    # the follow-ups of llama3 on this checkpoint: test_validate_llama3's fp32_report
    report = validate_model(
        llama3_dir, tiny_llama, steps=2, on_stage=stages.append, config_variants=False, parallel_layouts=False
    )
    assert report.equivalent, report.summary()
    assert stages == list(STAGES)
    assert report.port_output is not None and report.port_output.sequences
    assert "port_output" not in report.to_dict()
    assert "port_output" not in json.loads(report.to_json())


def test_a_failed_port_has_no_output(broken_port, tiny_llama: Path) -> None:
    port = broken_port("    def load_weights(", "    def load_weights((", name="unparsable")
    report = validate_model(port, tiny_llama, steps=2)
    assert not report.equivalent and report.failure is not None
    assert report.port_output is None


@pytest.mark.slow
def test_stages_in_order_on_two_ranks(llama3_dir: Path, tiny_llama: Path) -> None:
    stages: list[str] = []
    report = validate_model(llama3_dir, tiny_llama, tp=2, steps=2, on_stage=stages.append)
    assert report.equivalent, report.summary()
    assert stages == list(STAGES)
