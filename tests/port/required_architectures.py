"""The architectures the coverage issue names port and validate with no hand
edit, each from a tiny checkpoint of transformers' default config (seed 0, as
the corpus benchmark builds them): research picks the reference and the
codemods, and validation runs prefill and decode in fp32 and bf16 at TP=1
(TP=2 in fp32 too in the slow run; the corpus runs it for all of them); the
validation's follow-ups (config variants, FP8, parallel layouts) for the
architectures in ``FULLY_VALIDATED``, for all with --run-slow.

The tests are split by reference over ``test_required_*.py`` (the llama3
ports, the qwen3_moe ports, the other references) so that the suite's
``--dist loadfile`` can share them out between its workers; this module holds
what they share."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoport_cst.validate import build_tiny_checkpoint
from tests.validation_depth import port_at_depth, port_depth

# architecture -> the built-in reference its port starts from
REQUIRED = {
    "LlamaForCausalLM": "llama3",
    "MistralForCausalLM": "llama3",
    "Qwen2ForCausalLM": "llama3",
    "Qwen3ForCausalLM": "qwen3",
    "GemmaForCausalLM": "llama3",
    "Gemma2ForCausalLM": "smollm3",
    "Phi3ForCausalLM": "llama3",
    "StableLmForCausalLM": "llama3",
    "Starcoder2ForCausalLM": "starcoder2",
    "Olmo2ForCausalLM": "llama3",
    "GraniteForCausalLM": "llama3",
    "MixtralForCausalLM": "qwen3_moe",
    "Qwen2MoeForCausalLM": "qwen3_moe",
    "Qwen3MoeForCausalLM": "qwen3_moe",
}

# Validated with the follow-ups of the validation (config variants, FP8, parallel
# layouts) on the planned config in the default suite; every architecture, on the
# varied config too, with --run-slow (tests/validation_depth.py). Not here, since
# another default test already runs those follow-ups on the same code:
# - LlamaForCausalLM: tests/port/test_port_cli.py::test_port_validates_a_llama ports
#   the same architecture from llama3 with them (planned config; varied too with --run-slow);
# - Qwen3ForCausalLM and Starcoder2ForCausalLM: their ports are the reference with
#   the identity steps and the config guards only (rename-classes, config-guards,
#   set-constants, register-model); the follow-ups of the qwen3 reference run in
#   tests/codemods_attention/test_validations.py (qwen3-reference-sliding-yarn),
#   those of the starcoder2 reference in tests/codemods_mlp/test_ports_starcoder2.py
#   (starcoder2-reference), those of config guards on test_port_cli's llama port.
FULLY_VALIDATED = frozenset({"Gemma2ForCausalLM", "Qwen3MoeForCausalLM"})

# Ports the validation shows wrong; strict: the day they validate, the mark goes.
KNOWN_WRONG: dict[str, str] = {}


def required(reference: str | None = None, others: bool = False) -> list:
    """The architectures whose port starts from ``reference`` (or, with
    ``others``, from any reference but llama3 and qwen3_moe), as parameters,
    those in ``KNOWN_WRONG`` as strict xfails."""
    split = ("llama3", "qwen3_moe")
    names = sorted(
        name for name, ref in REQUIRED.items() if (ref not in split if others else ref == reference)
    )
    return [
        pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=KNOWN_WRONG[name]))
        if name in KNOWN_WRONG
        else name
        for name in names
    ]


def port_required(architecture: str, workdir: Path, tp: int, config: pytest.Config):
    """The port of ``architecture``'s tiny checkpoint (built once per ``workdir``)
    at the depth of this run."""
    source = workdir / f"{architecture}-src"
    if not source.exists():
        build_tiny_checkpoint(architecture, source, seed=0)
    name = "port_" + architecture.removesuffix("ForCausalLM").lower() + f"_tp{tp}"
    depth = port_depth(config, architecture, FULLY_VALIDATED)
    return port_at_depth(depth, str(source), name, workdir / "out", tp=tp, force=True, steps=8)


def check_ports_and_validates(architecture: str, workdir: Path, config: pytest.Config) -> None:
    outcome = port_required(architecture, workdir, tp=1, config=config)
    failures = [f"tp{r.tp} {r.dtype}: {r.first_diverging}" for r in outcome.runs if not r.equivalent]
    assert outcome.validated, failures
    assert [(r.tp, r.dtype) for r in outcome.runs] == [(1, "fp32"), (1, "bf16")]
    assert outcome.reference == REQUIRED[architecture]


def check_validates_on_two_ranks(architecture: str, workdir: Path, config: pytest.Config) -> None:
    outcome = port_required(architecture, workdir, tp=2, config=config)
    assert outcome.validated, [(r.tp, r.dtype, r.first_diverging) for r in outcome.runs]
    assert (2, "fp32") in [(r.tp, r.dtype) for r in outcome.runs]
