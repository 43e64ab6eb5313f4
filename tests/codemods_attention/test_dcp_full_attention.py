"""DCP on the full-attention layers of a checkpoint that mixes layer types
(``validate.dcp_layouts``). Gemma 2's tiny checkpoint has a sliding
layer first, where its port refuses DCP decode, so the default ``TP=4, DCP
2`` run never reached a full-attention layer's DCP code: the decode mask
built without the ranks' filled slots (the mutation benchmark's gemma2:1009)
validated. The run once more with every layer full attention reaches it:
the port's mask is built and its op-by-op decode attends over each rank's
share of the context (validates), while the mask without the filled slots,
or the TP group of the context-parallel prefill taken for a DCP decode (the
benchmark's gemma2:613), fails there."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest

from autoport_cst.validate import validate_model
from autoport_cst.validate.dcp_layouts import DECODE, PREFILL, dcp_runs
from tests.edited_copies import edited_copy

from .test_validations import CASES

GEMMA2 = next(case for case in CASES if case.id == "gemma2")
FULL = f"{DECODE[0]}, every layer full attention"
RUN = dict(steps=3, prompt_lengths=(8, 12, 20), config_variants=False, parallel_layouts=False)
FILLED = "                local_filled_slots=local_filled,\n"
PREFILL_TEST = (
    "        if self.apply_prefill_dcp and self.dcp_size > 1:\n            # Context-parallel prefill"
)

pytestmark = pytest.mark.usefixtures("shared_reference_runs")


@pytest.fixture(scope="module")
def gemma2(port_builder, tiny_checkpoint):
    return port_builder(GEMMA2.plan), tiny_checkpoint(GEMMA2.checkpoint)


def _runs(package: Path, checkpoint: Path) -> dict:
    return dict(dcp_runs(package, functools.partial(validate_model, package, **RUN), checkpoint))


def test_the_full_attention_run_is_asked_only_of_a_checkpoint_mixing_layer_types(gemma2, tmp_path):
    package, checkpoint = gemma2
    kinds = json.loads((checkpoint / "config.json").read_text(encoding="utf-8"))["layer_types"]
    assert "full_attention" in kinds and "sliding_attention" in kinds
    seen: list[list[str]] = []

    def validate_on(stand_in: Path, **options):
        seen.append(json.loads((Path(stand_in) / "config.json").read_text(encoding="utf-8"))["layer_types"])

    runs = dict(dcp_runs(package, validate_on, checkpoint))
    runs[FULL]()
    assert seen == [["full_attention"] * len(kinds)]
    # the context-parallel prefill too, which the reference takes
    assert f"{PREFILL[0]}, every layer full attention" in runs
    uniform = tmp_path / "uniform"
    uniform.mkdir()
    config = json.loads((checkpoint / "config.json").read_text(encoding="utf-8"))
    (uniform / "config.json").write_text(
        json.dumps({**config, "layer_types": ["full_attention"] * len(kinds)})
    )
    assert FULL not in dict(dcp_runs(package, validate_on, uniform))


def test_the_full_attention_layers_dcp_decode_is_driven(gemma2, tmp_path):
    package, checkpoint = gemma2
    found = _runs(package, checkpoint)[FULL]()
    assert found.equivalent and found.failure is None
    assert found.settings["layout"]["dcp"] == 2
    assert (package / "model.py").read_text(encoding="utf-8").count(FILLED) == 1
    mutant = edited_copy(package, tmp_path / "mutant", [(FILLED, "")])
    runs = _runs(mutant, checkpoint)
    assert runs[DECODE[0]]().failure.refusal  # refused at the sliding layer, as the port is
    found = runs[FULL]()
    assert not found.equivalent and found.failure is not None and not found.failure.refusal
    assert "dcp_active_mask needs local_filled_slots" in found.failure.message


def test_a_dcp_decode_summing_over_the_prefill_tp_group_fails(gemma2, tmp_path):
    package, checkpoint = gemma2
    wrong = PREFILL_TEST.replace(" and ", " or ")
    mutant = edited_copy(package, tmp_path / "mutant", [(PREFILL_TEST, wrong)])
    found = _runs(mutant, checkpoint)[FULL]()
    assert not found.equivalent and found.failure is None
    assert (found.first_diverging.component, found.first_diverging.phase) == ("layers.0.attention", "decode")
