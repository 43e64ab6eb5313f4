"""Deliberately broken copies of the reference fail, and the report names
where: the first diverging component, or the stage and rule the port broke."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoport_cst.validate import validate_model
from tests.validation_depth import follow_up_options, slow_run

# validations on one checkpoint share its transformers run (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("shared_reference_runs")

RMSNORM_VARIANCE = "        variance = hidden_states.pow(2).mean(-1, keepdim=True)\n"
LAYERNORM_VARIANCE = (
    "        hidden_states = hidden_states - hidden_states.mean(-1, keepdim=True)\n" + RMSNORM_VARIANCE
)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_layernorm_math_in_rmsnorm_names_the_first_norm(broken_port, tiny_llama: Path, dtype: str) -> None:
    port = broken_port(RMSNORM_VARIANCE, LAYERNORM_VARIANCE)
    report = validate_model(port, tiny_llama, dtype=dtype, steps=4)
    assert not report.equivalent and report.exit_code == 1
    assert report.first_diverging.component == "layers.0.input_norm"
    assert report.first_diverging.phase == "prefill"
    assert "layers.0.input_norm" in report.summary()


def test_dropped_residual_names_the_layer_output(broken_port, tiny_llama: Path) -> None:
    port = broken_port(
        "            hidden_states = self.mlp(hidden_states, is_prefill=True)\n        return residual + hidden_states",
        "            hidden_states = self.mlp(hidden_states, is_prefill=True)\n        return hidden_states",
    )
    report = validate_model(port, tiny_llama, steps=4)
    assert not report.equivalent
    assert (report.first_diverging.component, report.first_diverging.phase) == ("layers.0.output", "prefill")
    # everything before the residual add still matches
    passed = {(c["name"], c["phase"]) for c in report.components if c["passed"]}
    assert ("layers.0.mlp", "prefill") in passed and ("layers.0.attention", "prefill") in passed


def test_decode_only_bug_names_decode_attention(broken_port, tiny_llama: Path) -> None:
    port = broken_port(
        "            softmax_scale=self.scaling / self.k_scale_float,\n",
        "            softmax_scale=self.scaling * 1.05 / self.k_scale_float,\n",
    )
    report = validate_model(port, tiny_llama, dtype="bf16", steps=4)
    assert not report.equivalent
    assert (report.first_diverging.component, report.first_diverging.phase) == (
        "layers.0.attention",
        "decode",
    )
    assert all(c["passed"] for c in report.components if c["phase"] == "prefill")


def test_tensor_computed_in_init_and_read_fails_loudly(broken_port, tiny_llama: Path) -> None:
    """A plain tensor attribute made in __init__ stays on the meta device; the
    first computation with it fails and names it."""
    port = broken_port(
        "        inv_freq = 1.0 / (self.rope_theta ** (exponents.to(torch.float32) / self.head_dim))\n",
        "        inv_freq = 1.0 / (self.rope_theta ** (exponents.to(torch.float32) / self.head_dim))\n"
        "        inv_freq = inv_freq * self.inv_freq_scale\n",
    )
    model = port / "model.py"
    text = model.read_text(encoding="utf-8")
    anchor = "        self.head_dim = config.head_dim\n        self.rope_parameters"
    assert text.count(anchor) == 1
    model.write_text(
        text.replace(
            anchor,
            "        self.head_dim = config.head_dim\n        self.inv_freq_scale = torch.ones(1)\n"
            "        self.rope_parameters",
        ),
        encoding="utf-8",
    )
    linted = validate_model(port, tiny_llama, steps=2)  # the hardware rule, before any run
    assert not linted.equivalent and linted.exit_code == 1 and linted.failure.stage == "lint"
    assert "NRN001 no-tensor-compute-in-init" in linted.failure.message
    report = validate_model(port, tiny_llama, steps=2, lint=False)  # the run's own check
    assert not report.equivalent and report.exit_code == 1
    assert report.failure.stage == "prefill"
    assert "'model.rotary_emb.inv_freq_scale'" in report.failure.message
    assert "meta" in report.failure.message and "__init__" in report.failure.message


def test_tensor_attribute_never_read_is_allowed(broken_port, tiny_llama: Path, request) -> None:
    """Real models keep FP8 KV-cache scales as plain attributes made in
    __init__ and read them only with an FP8 cache: unread, the run's meta-tensor
    check lets them pass. The lint rule NRN001 refuses a tensor made in
    __init__ whether read or not, before any run."""
    port = broken_port(
        "        self.head_dim = config.head_dim\n        self.rope_parameters",
        "        self.head_dim = config.head_dim\n"
        "        self.unused_scale = torch.ones(1, 1)\n"
        "        self.rope_parameters",
    )
    linted = validate_model(port, tiny_llama, steps=2, dtype="fp32")
    assert linted.failure.stage == "lint" and "NRN001 no-tensor-compute-in-init" in linted.failure.message
    # the run's follow-ups (each layout's ranks build the port too) with --run-slow only
    follow_ups = follow_up_options(slow_run(request.config))
    report = validate_model(port, tiny_llama, steps=2, dtype="fp32", lint=False, **follow_ups)
    assert report.equivalent, report.summary()


def test_1d_bias_to_the_decode_kernel_fails_like_hardware(broken_port, tiny_llama: Path) -> None:
    port = broken_port(
        "            bias_out=None,\n",
        "            bias_out=torch.zeros(self.hidden_size, dtype=self.dtype),\n",
    )
    linted = validate_model(port, tiny_llama, steps=2)  # the hardware rule, before any run
    assert linted.failure.stage == "lint" and "NRN004 decode-bias-2d" in linted.failure.message
    assert f"fix: `autoport-cst lint --fix {port}`" in linted.failure.message
    report = validate_model(port, tiny_llama, steps=2, lint=False)  # the stand-in's own check
    assert not report.equivalent
    assert report.failure.stage == "decode"
    assert "Bias shape must be [1, 64], got (64,)" in report.failure.message
    assert "model.py" in report.failure.message


def test_missing_feature_qkv_bias_is_caught(llama3_dir: Path, tmp_path: Path) -> None:
    """The llama3 reference has no QKV bias; a Qwen2 checkpoint has one (the
    tiny checkpoint gives biases random values), so the port diverges at the
    first attention and the report lists the biases it never loaded."""
    from autoport_cst.validate.tiny import build_tiny_checkpoint

    qwen2 = build_tiny_checkpoint("Qwen2ForCausalLM", tmp_path / "qwen2").directory
    report = validate_model(llama3_dir, qwen2, steps=2)
    assert not report.equivalent
    assert (report.first_diverging.component, report.first_diverging.phase) == (
        "layers.0.attention",
        "prefill",
    )
    assert "model.layers.0.self_attn.q_proj.bias" in report.unused_checkpoint_keys
