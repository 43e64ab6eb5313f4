"""A validation report's rows, as the validator compared them, for the tests
that explain a bf16 failure (``tests/coverage_moe/ties.py``,
``tests/gpt_oss/explain.py``): the scenario the run used and the reference
rows matching the port's."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from autoport_cst.validate.compare import _ref_logits, _ref_rows, prefill_spans
from autoport_cst.validate.report import ValidationReport
from autoport_cst.validate.scenario import Scenario, cache_paths_fit


def scenario_of(report: ValidationReport, checkpoint: Path, steps: int) -> Scenario:
    """The prompts (the cache paths' sequences included), steps and cache
    layout of the run behind ``report``, rebuilt from its settings as the
    validator builds them."""
    vocab = json.loads((Path(checkpoint) / "config.json").read_text(encoding="utf-8"))["vocab_size"]
    settings = report.settings
    tp = settings["tp"]
    return Scenario.build(
        vocab,
        tp,
        steps,
        tuple(settings["prompt_lengths"]),
        settings["block_size"],
        settings["seed"],
        cache_paths=cache_paths_fit(tp),
    )


def aligned(
    reference: list[torch.Tensor], component: str, scenario: Scenario, phase: str, port
) -> torch.Tensor:
    """``reference`` (per sequence, per position) in the order of the port's
    compared rows of ``component``, as the validator aligns them: the
    positions each prefill call computed (components) or sampled (logits),
    and each sequence's row of every decode step."""
    if component == "logits":
        return _ref_logits(reference, scenario, phase, port).double()
    return _ref_rows(reference, scenario, phase, prefill_spans(port, scenario)).double()
