"""Decode calls of two new tokens per sequence (``validate_model(...,
decode_tokens=2)``, a default layout: ``parallel_checks``), as the runner's
verification step of speculative decoding feeds them: code that one token
per step cannot tell apart is judged."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoport_cst.validate import validate_model
from autoport_cst.validate.scenario import Scenario
from tests.edited_copies import edited_copy

ROOT = Path(__file__).resolve().parents[2]
QWEN3 = ROOT / "reference_models" / "qwen3"
DEEPSEEK_V3 = ROOT / "reference_models" / "deepseek_v3"


@pytest.fixture(scope="module")
def tiny_qwen3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from autoport_cst.validate.tiny import build_tiny_checkpoint

    base = tmp_path_factory.mktemp("decode-tokens") / "tiny"
    build_tiny_checkpoint("Qwen3ForCausalLM", base, seed=0)
    return base


def _run(port: Path, checkpoint: Path, **options):
    return validate_model(port, checkpoint, steps=3, config_variants=False, parallel_layouts=False, **options)


def test_the_decode_calls_take_the_steps_two_at_a_time() -> None:
    scenario = Scenario(prompts=((1, 2),), steps=5, layout=None, decode_tokens=2)  # type: ignore[arg-type]
    assert scenario.decode_calls() == ((0, 2), (2, 2), (4, 1))
    assert [scenario.decode_width(step) for step, _ in scenario.decode_calls()] == [2, 2, 1]


def test_v_rows_of_a_decode_step_in_the_wrong_order_fail_at_two_tokens_per_step(
    tmp_path: Path, tiny_qwen3: Path
) -> None:
    # with one new token per sequence the step's V rows [B, Nkv, S, Dh] flatten alike
    # whether (B, Nkv) or (B, S) is transposed; with two they do not
    old = "v_rows = v_new.transpose(0, 1).reshape(-1, self.head_dim)"
    new = "v_rows = v_new.transpose(0, 2).reshape(-1, self.head_dim)"
    port = edited_copy(QWEN3, tmp_path / "port", [(old, new)])
    assert _run(port, tiny_qwen3).equivalent  # one token per step cannot tell
    report = _run(port, tiny_qwen3, decode_tokens=2)
    assert not report.equivalent and report.exit_code == 1
    assert report.first_diverging.component == "layers.0.attention", report.summary()
    assert report.first_diverging.phase == "decode"
    reference = _run(QWEN3, tiny_qwen3, decode_tokens=2)
    assert reference.equivalent, reference.summary()
    assert reference.settings["decode_tokens"] == 2


def test_a_port_without_speculative_decoding_refuses_several_tokens_per_step(tmp_path: Path) -> None:
    from autoport_cst.validate.tiny import build_tiny_checkpoint

    checkpoint = build_tiny_checkpoint("DeepseekV3ForCausalLM", tmp_path / "tiny", seed=0).directory
    report = _run(DEEPSEEK_V3, checkpoint, decode_tokens=2)
    assert not report.equivalent
    assert report.failure.refusal and "spec_decode_metadata" in report.failure.message


def test_several_tokens_per_step_are_not_run_with_a_sliding_window() -> None:
    from autoport_cst.errors import InputError
    from autoport_cst.validate.layout import ParallelLayout
    from autoport_cst.validate.run_scenario import with_decode_tokens

    scenario = Scenario(prompts=((1, 2),), steps=4, layout=None)  # type: ignore[arg-type]
    plain = ParallelLayout()
    assert with_decode_tokens(scenario, 1, {"sliding_window": 6}, plain) is scenario
    assert with_decode_tokens(scenario, 2, {"sliding_window": None}, plain).decode_tokens == 2
    assert (
        with_decode_tokens(
            scenario, 2, {"sliding_window": 6, "use_sliding_window": False}, plain
        ).decode_tokens
        == 2
    )
    with pytest.raises(InputError, match="one window start per sequence"):
        with_decode_tokens(scenario, 2, {"sliding_window": 6}, plain)
    with pytest.raises(InputError, match="plain TP"):
        with_decode_tokens(scenario, 2, {}, ParallelLayout(attention_dp=2))
