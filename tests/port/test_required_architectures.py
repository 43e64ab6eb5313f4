"""The architectures the coverage issue names port and validate with no hand
edit, each from a tiny checkpoint of transformers' default config (seed 0, as
the corpus benchmark builds them): research picks the reference and the
codemods, and validation runs prefill and decode in fp32 and bf16 at TP=1
(TP=2 in fp32 too in the slow run; the corpus runs it for all of them); the
validation's follow-ups (config variants, FP8, parallel layouts) for one
architecture per reference (``FULLY_VALIDATED``), for all with --run-slow."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from autoport_cst.validate import build_tiny_checkpoint  # noqa: E402
from tests.validation_depth import port_at_depth, port_depth  # noqa: E402

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


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("required")


# validated with the follow-ups of the validation (config variants, FP8, parallel
# layouts) on the planned config in the default suite: one architecture per
# reference; every architecture, on the varied config too, with --run-slow
# (tests/validation_depth.py)
FULLY_VALIDATED = frozenset(
    {
        "LlamaForCausalLM",
        "Qwen3ForCausalLM",
        "Gemma2ForCausalLM",
        "Starcoder2ForCausalLM",
        "Qwen3MoeForCausalLM",
    }
)


def _port(architecture: str, workdir: Path, tp: int, config: pytest.Config):
    source = workdir / f"{architecture}-src"
    if not source.exists():
        build_tiny_checkpoint(architecture, source, seed=0)
    name = "port_" + architecture.removesuffix("ForCausalLM").lower() + f"_tp{tp}"
    depth = port_depth(config, architecture, FULLY_VALIDATED)
    return port_at_depth(depth, str(source), name, workdir / "out", tp=tp, force=True, steps=8)


# Ports the validation shows wrong; strict: the day they validate, the mark goes.
KNOWN_WRONG: dict[str, str] = {}


def _required() -> list:
    return [
        pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=KNOWN_WRONG[name]))
        if name in KNOWN_WRONG
        else name
        for name in sorted(REQUIRED)
    ]


@pytest.mark.parametrize("architecture", _required())
def test_ports_and_validates(architecture, workdir, request):
    outcome = _port(architecture, workdir, tp=1, config=request.config)
    failures = [f"tp{r.tp} {r.dtype}: {r.first_diverging}" for r in outcome.runs if not r.equivalent]
    assert outcome.validated, failures
    assert [(r.tp, r.dtype) for r in outcome.runs] == [(1, "fp32"), (1, "bf16")]
    assert outcome.reference == REQUIRED[architecture]


@pytest.mark.slow
@pytest.mark.parametrize("architecture", sorted(REQUIRED))
def test_ports_and_validates_on_two_ranks(architecture, workdir, request):
    outcome = _port(architecture, workdir, tp=2, config=request.config)
    assert outcome.validated, [(r.tp, r.dtype, r.first_diverging) for r in outcome.runs]
    assert (2, "fp32") in [(r.tp, r.dtype) for r in outcome.runs]
