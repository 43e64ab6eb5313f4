"""The attention codemods on references in the real vllm_neuron structure
(our references: flash and segmented prefill, the
context-parallel prefill, masked and bounded-gather decode, attention data
parallelism, qwen3's decode with ``update_cache=False``): each port must
match transformers on a tiny checkpoint, with the runner's chunked prefill
and prefix-cache hit prompts (segmented) among the prompts.

The windows (6 tokens) are shorter than the prompts and the chunks, the
softcap (1.5) bites on a 16-wide head, and the sinks are random: each
feature changes the outputs on every path it reaches."""

from __future__ import annotations

import json

import pytest

from autoport_cst.validate import validate_model
from tests.validation_depth import follow_up_options, validates_fully

from .conftest import ROOT

NEXT = ROOT / "reference_models"
STEPS = 6


def example(name: str) -> dict:
    return json.loads((ROOT / "examples" / f"{name}.plan.json").read_text(encoding="utf-8"))


CASES = {
    "mistral": (example("mistral"), "llama3", {"model_type": "mistral", "sliding_window": 6}),
    "vaultgemma": (
        example("vaultgemma"),
        "llama3",
        {
            "model_type": "vaultgemma",
            "num_hidden_layers": 2,
            "sliding_window": 6,
            "query_pre_attn_scalar": 25,
            "attn_logit_softcapping": 1.5,
            "final_logit_softcapping": 5.0,
        },
    ),
    "granite_swa": (
        example("granite_swa"),
        "llama3",
        {
            "model_type": "granite_swa",
            "num_hidden_layers": 2,
            "sliding_window": 6,
            "attention_multiplier": 0.2,
            "embedding_multiplier": 6.0,
            "residual_multiplier": 0.5,
            "logits_scaling": 4.0,
        },
    ),
    "qwen3-window": (
        example("qwen3"),
        "qwen3",
        {
            "model_type": "qwen3",
            "use_sliding_window": True,
            "sliding_window": 6,
            "layer_types": ["sliding_attention", "full_attention"],
            "num_hidden_layers": 2,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
        },
    ),
}


@pytest.fixture(scope="module")
def case_of(port_builder, tiny_checkpoint):
    def get(name: str):
        plan, reference, checkpoint = CASES[name]
        return port_builder(plan, str(NEXT / reference)), tiny_checkpoint(checkpoint)

    return get


def _segmented(report) -> bool:
    return any(call["kind"] != "whole" for call in report.settings.get("prefill_calls", []))


# cases validated with the follow-ups of a passing fp32 run (config variants, FP8, parallel
# layouts) in the default suite; every case with --run-slow (tests/validation_depth.py). Not
# granite_swa: its follow-ups run in the default suite in test_validations.py's
# test_port_validates[granite-swa-fp32], the same port (examples/granite_swa.plan.json on
# reference_models/llama3) on the same checkpoint (the same config, seed 0), over 8 decode steps
FULLY_VALIDATED = frozenset({"mistral", "vaultgemma", "qwen3-window"})


@pytest.mark.parametrize("name", list(CASES))
def test_multipath_port_validates(name, case_of, request):
    package, checkpoint = case_of(name)
    follow_ups = follow_up_options(validates_fully(request.config, name, FULLY_VALIDATED))
    report = validate_model(package, checkpoint, dtype="fp32", steps=STEPS, **follow_ups)
    assert report.equivalent, report.summary()
    assert _segmented(report), "the chunked-prefill paths were not run"


@pytest.mark.parametrize(
    "name, dtype, tp",
    [
        # the sinks' loader and the decode kernel's sinks, sharded: in the default run, the
        # TP=2 layout among the follow-ups of test_validations.py's test_port_validates[granite-swa-fp32]
        pytest.param("granite_swa", "fp32", 2, marks=pytest.mark.slow),
        pytest.param("vaultgemma", "bf16", 1, marks=pytest.mark.slow),
        pytest.param("vaultgemma", "fp32", 2, marks=pytest.mark.slow),
        pytest.param("mistral", "bf16", 1, marks=pytest.mark.slow),
    ],
)
def test_multipath_port_validates_sharded_and_in_bf16(name, dtype, tp, case_of):
    package, checkpoint = case_of(name)
    report = validate_model(package, checkpoint, dtype=dtype, steps=4, tp=tp)
    assert report.equivalent, report.summary()


def test_guarded_paths_name_the_feature(case_of):
    """The context-parallel prefill takes neither window nor sinks nor a
    softcap: those paths refuse, naming the feature."""
    granite, _ = case_of("granite_swa")
    vaultgemma, _ = case_of("vaultgemma")
    granite_text = (granite / "model.py").read_text(encoding="utf-8")
    assert "attention sinks: NF.segmented_attention_cp" in granite_text
    assert "sliding-window attention: NF.segmented_attention_cp" in granite_text
    assert "attention softcap: NF.segmented_attention_cp" in (vaultgemma / "model.py").read_text(
        encoding="utf-8"
    )
