"""Prompt embeddings (vllm_neuron's runner with ``enable_prompt_embeds``):
a default validation goes on to runs that feed every odd prompt position as
transformers' input embedding of its token (``inputs_embeds``, the id 0,
``is_token_ids`` false) at TP=1 and at TP=2, where the port cuts the
embeddings to its sequence-parallel slice; the transformers run of the plain
validation is reused."""

from __future__ import annotations

from pathlib import Path

import torch

from autoport_cst.validate import validate_model
from autoport_cst.validate.parallel_checks import LAYOUTS
from autoport_cst.validate.report import ValidationReport
from autoport_cst.validate.scenario import PrefillCall, Scenario

EMBEDS, EMBEDS_TP2 = "prompt embeddings", "prompt embeddings at TP=2"
CUT = "if is_prefill and self.world_size > 1 and inputs_embeds is not None and is_token_ids is not None:"


def _run(port: Path, checkpoint: Path, **options) -> ValidationReport:
    return validate_model(port, checkpoint, steps=2, config_variants=False, **options)


def _entries(report: ValidationReport) -> dict[str, bool | None]:
    return {e["label"]: e["equivalent"] for e in report.parallel_layouts}


def test_the_runs_are_default_layouts_and_feed_every_odd_position() -> None:
    assert (EMBEDS, {"prompt_embeds": True}) in LAYOUTS
    assert (EMBEDS_TP2, {"tp": 2, "prompt_embeds": True}) in LAYOUTS
    assert [p for p in range(6) if Scenario.embedded(p)] == [1, 3, 5]


def test_the_embedded_rows_carry_the_given_embeddings_and_id_0() -> None:
    from autoport_cst.validate.driver import _embed_prompt
    from autoport_cst.validate.runner_metadata import StepInputs

    embeddings = torch.arange(12.0).reshape(6, 2)
    step = StepInputs(torch.tensor([7, 8, 9, 0]), torch.zeros(4), torch.zeros(1), {})
    _embed_prompt(step, embeddings, PrefillCall(0, 2, 5, padded_rows=4))
    assert step.input_ids.tolist() == [7, 0, 9, 0]
    assert step.is_token_ids.tolist() == [True, False, True, True]  # the padding row too
    assert step.inputs_embeds[1].tolist() == embeddings[3].tolist()
    assert step.inputs_embeds[[0, 2, 3]].abs().sum() == 0


def test_a_correct_port_validates_with_prompt_embeddings(llama3_dir: Path, tiny_llama: Path) -> None:
    report = _run(llama3_dir, tiny_llama)
    assert report.equivalent, report.summary()
    assert _entries(report)[EMBEDS] is True and _entries(report)[EMBEDS_TP2] is True


def test_prompt_embeddings_not_cut_at_tp2_fail_there(broken_port, tiny_llama: Path) -> None:
    # the sequence-parallel cut taken from TP=3 on: each TP=2 rank merges the whole prompt's rows
    port = broken_port(CUT, CUT.replace("world_size > 1", "world_size > 2"))
    report = _run(port, tiny_llama)
    assert not report.equivalent
    entries = _entries(report)
    assert entries[EMBEDS] is True and entries[EMBEDS_TP2] is False, report.parallel_layouts
    assert list(entries)[-1] == EMBEDS_TP2  # the first failure ends the checks
    assert all(entries[label] for label in entries if label not in (EMBEDS, EMBEDS_TP2))
    assert report.summary().startswith(f"not equivalent: the port failed at {EMBEDS_TP2}: ")


def test_prompt_embeddings_ignored_fail_at_tp1(broken_port, tiny_llama: Path) -> None:
    port = broken_port(
        "hidden_states = NF.merge_prompt_embeds(hidden_states, inputs_embeds, is_token_ids)",
        "hidden_states = NF.merge_prompt_embeds(hidden_states, None, is_token_ids)",
    )
    report = _run(port, tiny_llama)
    assert not report.equivalent
    assert _entries(report)[EMBEDS] is False, report.parallel_layouts
    assert report.summary().startswith(f"not equivalent: {EMBEDS}: "), report.summary()


def test_a_port_whose_forward_takes_no_prompt_embeddings_is_not_run(broken_port, tiny_llama: Path) -> None:
    signature = "        rank: torch.Tensor | None = None,\n        **kwargs,\n    ):\n        positions = positions.to("
    # the causal LM's forward without the two arguments (it hands the model None)
    port = broken_port(
        "        inputs_embeds: torch.Tensor | None = None,\n        is_token_ids: torch.Tensor | None = None,\n"
        "        attn_metadata",
        "        attn_metadata",
        name="no_arguments",
    )
    model = port / "model.py"
    text = model.read_text(encoding="utf-8")
    assert text.count(signature) == 1
    model.write_text(
        text.replace(
            signature,
            signature.replace(
                "        positions =", "        inputs_embeds = is_token_ids = None\n        positions ="
            ),
        ),
        encoding="utf-8",
    )
    report = _run(port, tiny_llama)
    assert report.equivalent, report.summary()
    summaries = {e["label"]: e["summary"] for e in report.parallel_layouts}
    assert summaries[EMBEDS].startswith("not run: the port refuses it (prefill: the model's forward takes no")
