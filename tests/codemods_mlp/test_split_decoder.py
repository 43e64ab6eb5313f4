"""The decoder-layer codemods on a layer split as the real vllm_neuron code
splits it, which our llama3 reference does: a decode ``forward`` that moves
the rows between the data-parallel layouts around each sublayer and calls
each sublayer in an ``if``/``else`` whose first branch hands the norm's
weight to a fused FP8 kernel, and a ``_forward_prefill``.

The fused branches are never taken here (no FP8 quantization), and the
layout moves are the identity (one data-parallel rank): the ports must
compute the target model through both forwards, and a codemod that edited
one forward only would leave prefill and decode computing different models,
which the validations below catch (the last test shows that they can tell)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from .conftest import ROOT, plan_dict

REFERENCE = ROOT / "reference_models" / "llama3"

COHERE = plan_dict(
    "cohere",
    "CohereForCausalLM",
    {
        "norm": {"kind": "layernorm", "bias": False, "eps_key": "layer_norm_eps"},
        "rope": {"type": "default", "style": "interleaved"},
        "embedding": {"tied": True},
        "lm_head": {"logits_divisor": 16.0, "logits_key": "logit_scale", "logits_form": "multiplier"},
        "residual": {"parallel": "shared_norm"},
    },
)
PLANS = {"granite": "granite", "olmo2": "olmo2", "stablelm": "stablelm", "cohere": COHERE}


@pytest.fixture(scope="module")
def ports(tmp_path_factory):
    from autoport_cst.apply import build_port, load_reference, write_port
    from autoport_cst.plan import load_plan, parse_plan

    reference = load_reference(str(REFERENCE))
    cache: dict[str, Path] = {}

    def build(name: str) -> Path:
        if name not in cache:
            plan = PLANS[name]
            parsed = (
                load_plan(ROOT / "examples" / f"{plan}.plan.json")
                if isinstance(plan, str)
                else parse_plan(plan)
            )
            result = build_port(parsed, reference)
            assert result.ok, str(result.failure)
            out = tmp_path_factory.mktemp(f"port-{name}")
            write_port(out, result.files, result.package_dir, force=True)
            cache[name] = out / result.package_dir
        return cache[name]

    return build


def _layer(package: Path) -> str:
    text = (package / "model.py").read_text()
    start = text.index("DecoderLayer(nn.Module):")
    return text[start : text.index("\nclass ", start)]


# -- what the codemods write ---------------------------------------------------------------


def test_residual_multiplier_in_both_forwards(ports):
    layer = _layer(ports("granite"))
    assert layer.count("hidden_states = residual + hidden_states * self.residual_multiplier") == 2  # decode
    assert layer.count("return residual + hidden_states * self.residual_multiplier") == 2  # decode, prefill


def test_post_norms_in_both_forwards_and_the_fused_branches_guarded(ports):
    layer = _layer(ports("olmo2"))
    assert "input_layernorm" not in layer
    assert layer.count("hidden_states = self.post_attention_layernorm(hidden_states)") == 2
    assert layer.count("hidden_states = self.post_feedforward_layernorm(hidden_states)") == 2
    # decode guards both fused branches, prefill the MLP's (its attention has none)
    assert (
        layer.count('raise NotImplementedError("post norm placement: the FP8 kernels fuse a norm before') == 3
    )
    assert "ln_w=" not in layer


def test_layernorm_guards_the_fused_rmsnorm_branches(ports):
    layer = _layer(ports("stablelm"))
    assert layer.count('raise NotImplementedError("LayerNorm: the FP8 kernels fuse an RMSNorm') == 3
    assert layer.count("self.input_layernorm(hidden_states)") == 2


def test_parallel_residual_carries_the_layout_moves(ports):
    layer = _layer(ports("cohere"))
    for name in ("attn_output", "residual", "hidden_states"):
        assert f"{name} = _dp_transition({name}, self.attn_dp_group, self.mlp_dp_group)" in layer
    assert layer.count("return attn_output + mlp_output + residual") == 2
    assert "post_attention_layernorm" not in layer


# -- and what the ports compute --------------------------------------------------------------

pytest.importorskip("torch")
pytest.importorskip("transformers")

# the multipliers of a Granite checkpoint differ from 1 (the attention
# scale equals the tiny model's head_dim ** -0.5); Cohere's default
# logit_scale is 1/16
GRANITE_CONFIG = {
    "embedding_multiplier": 12.0,
    "residual_multiplier": 0.22,
    "logits_scaling": 8.0,
    "attention_multiplier": 0.25,
}
CHECKPOINTS = {
    "granite": ("GraniteForCausalLM", GRANITE_CONFIG),
    "olmo2": ("Olmo2ForCausalLM", {}),
    "stablelm": ("StableLmForCausalLM", {}),
    "cohere": ("CohereForCausalLM", {}),
}


@pytest.mark.parametrize(
    "case, tp, dtype",
    [
        ("granite", 1, "fp32"),
        ("olmo2", 1, "bf16"),
        ("cohere", 2, "fp32"),
        pytest.param("stablelm", 1, "fp32", marks=pytest.mark.slow),
    ],
)
def test_port_of_a_split_decoder_validates(case, tp, dtype, ports, checkpoints):
    from autoport_cst.validate import validate_model

    architecture, overrides = CHECKPOINTS[case]
    report = validate_model(ports(case), checkpoints.get(architecture, **overrides), tp=tp, dtype=dtype)
    assert report.equivalent, report.summary()


def test_a_multiplier_missing_from_prefill_fails(ports, checkpoints, tmp_path):
    """The check above can tell: the granite port without the residual
    multiplier in ``_forward_prefill`` does not validate."""
    from autoport_cst.validate import validate_model

    package = tmp_path / "granite"
    shutil.copytree(ports("granite"), package)
    model = package / "model.py"
    text = model.read_text()
    start = text.index("    def _forward_prefill(")
    prefill = text[start : text.index("\nclass ", start)]
    model.write_text(
        text[:start] + prefill.replace(" * self.residual_multiplier", "") + text[start + len(prefill) :]
    )
    report = validate_model(
        package, checkpoints.get("GraniteForCausalLM", **GRANITE_CONFIG), tp=1, dtype="fp32"
    )
    assert not report.equivalent
