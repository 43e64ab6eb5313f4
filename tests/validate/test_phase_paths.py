"""Paths the validation drives: prefill and decode each take their own
kernels (the stand-in records them per phase), and prefill calls sample a
subset of their positions, as the runner does (the last token), besides the
first call, which samples every position."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoport_cst.validate import validate_model
from autoport_cst.validate.scenario import PrefillCall, Scenario
from autoport_cst.validate.standin import kernel_phases

# Appended to the llama3 reference's model.py: its attention takes the decode
# path in every call. The decode kernel also attends over the cache, so the
# numbers of a prefill through it match; only the kernel record tells.
THROUGH_DECODE = """

def _through_decode(self, hidden_states, positions, position_embeddings, attn_metadata=None):
    return self.forward_decode(hidden_states, positions, position_embeddings, attn_metadata)


LlamaAttention.forward = _through_decode
"""
SAMPLING = "        if sampling_positions is not None:\n"
SAMPLING_INVERTED = "        if sampling_positions is None:\n"


@pytest.fixture
def mutant(tmp_path: Path, llama3_dir: Path):
    import shutil

    def make(old: str | None, new: str) -> Path:
        target = tmp_path / "mutant"
        shutil.copytree(llama3_dir, target, ignore=shutil.ignore_patterns("__pycache__"))
        model = target / "model.py"
        text = model.read_text(encoding="utf-8")
        if old is None:
            text += new
        else:
            assert text.count(old) == 1, old
            text = text.replace(old, new)
        model.write_text(text, encoding="utf-8")
        return target

    return make


def test_prefill_through_the_decode_path_fails(mutant, tiny_llama: Path) -> None:
    report = validate_model(mutant(None, THROUGH_DECODE), tiny_llama, steps=2)
    assert not report.equivalent and report.exit_code == 1
    assert report.failure.stage == "prefill"
    # the attention's decode method, or the first decode kernel, refused in a prefill forward
    assert "called in a prefill forward" in report.failure.message
    assert "model.py" in report.failure.message  # where the port called it


def test_without_the_phase_rule_that_mutant_validates(mutant, tiny_llama: Path, monkeypatch) -> None:
    """The control: at TP=1 the plain run's numbers do not tell the mutant
    apart (at TP=2, a default parallel layout, the decode path fails on the
    prefill's sequence-parallel slice; the FP8 KV-cache follow-up, a config
    variant, fails too: the decode path attends over the FP8 cache where a
    prefill attends over the fresh K/V)."""
    monkeypatch.setattr(kernel_phases, "DECODE_ONLY", frozenset())
    monkeypatch.setattr(kernel_phases, "PREFILL_ONLY", frozenset())
    monkeypatch.setattr(kernel_phases, "PHASE_METHODS", {})
    report = validate_model(
        mutant(None, THROUGH_DECODE), tiny_llama, steps=2, parallel_layouts=False, config_variants=False
    )
    assert report.equivalent, report.summary()


def test_the_reference_runs_each_phase_on_its_own_kernels(llama3_dir: Path, tiny_llama: Path) -> None:
    # the follow-ups of llama3 on this checkpoint: test_validate_llama3's fp32_report
    report = validate_model(llama3_dir, tiny_llama, steps=2, config_variants=False, parallel_layouts=False)
    assert report.equivalent, report.summary()
    calls = report.environment["stand_in"]["kernel_calls"]
    assert calls["prefill"].get("flash_attention") and not calls["prefill"].get("attention_decode")
    assert calls["decode"].get("attention_decode") and not calls["decode"].get("flash_attention")


def test_a_port_that_ignores_sampling_positions_fails(mutant, tiny_llama: Path) -> None:
    """Inverting the port's ``sampling_positions is not None`` test returns
    every row where the runner asked for the last token."""
    report = validate_model(mutant(SAMPLING, SAMPLING_INVERTED), tiny_llama, steps=2, prefill="off")
    assert not report.equivalent and report.exit_code == 1
    assert report.failure.stage == "prefill"
    assert "1 sampling position(s)" in report.failure.message


def test_sampling_every_position_would_not_see_it(mutant, tiny_llama: Path, monkeypatch) -> None:
    """The control: with every position sampled (the old scenario) the
    mutant validates on the prompts prefilled whole (unpadded: every row is
    a sampled one)."""
    monkeypatch.setattr(PrefillCall, "sampled", property(lambda call: tuple(range(call.tokens))))
    report = validate_model(mutant(SAMPLING, SAMPLING_INVERTED), tiny_llama, steps=2, prefill="off")
    assert report.equivalent, report.summary()


def test_the_first_call_samples_every_position_the_others_their_last() -> None:
    scenario = Scenario.build(512, tp=1, steps=2, cache_paths=True)
    plan = scenario.prefill_plan(cache_paths=True)
    assert plan[0].sampled_positions == tuple(range(plan[0].start, plan[0].end))
    assert all(call.sampled_positions == (call.end - 1,) for call in plan[1:])
    assert len(plan) == 6


def test_kernel_phase_rule_both_ways() -> None:
    kernel_phases.reset()
    kernel_phases.record("attention_decode")  # outside a phase: counted nowhere, never refused
    with kernel_phases.phase("decode"):
        kernel_phases.record("attention_decode")
        kernel_phases.record("qkv_proj")
        with pytest.raises(kernel_phases.KernelPhaseError, match="NF.flash_attention is a prefill kernel"):
            kernel_phases.record("flash_attention")
    with kernel_phases.phase("prefill"):
        kernel_phases.record("qkv_proj")
        with pytest.raises(kernel_phases.KernelPhaseError, match="NF.moe_block_tkg is a decode kernel"):
            kernel_phases.record("moe_block_tkg")
    assert kernel_phases.calls()["decode"] == {"attention_decode": 1, "flash_attention": 1, "qkv_proj": 1}
    kernel_phases.reset()
    assert kernel_phases.calls() == {"prefill": {}, "decode": {}}


def test_a_phase_method_called_in_the_other_phase_is_refused() -> None:
    import torch

    from autoport_cst.validate.standin import kernel_phases

    class Layer(torch.nn.Module):
        def forward(self, x: torch.Tensor, decode: bool) -> torch.Tensor:
            return x if decode else self._forward_prefill(x)

        def _forward_prefill(self, x: torch.Tensor) -> torch.Tensor:
            return x + 1

    model = torch.nn.Sequential(Layer())
    assert kernel_phases.guard_phase_methods(model) == ["0._forward_prefill"]
    with kernel_phases.phase("prefill"):
        assert float(model[0](torch.zeros(1), decode=False)) == 1.0
    with (
        kernel_phases.phase("decode"),
        pytest.raises(kernel_phases.KernelPhaseError, match="0._forward_prefill"),
    ):
        model[0](torch.zeros(1), decode=False)


def test_inverted_decode_test_of_the_decoder_layer_fails(broken_port, tiny_llama) -> None:
    """The layer's own branch, not only the kernels: a hand-written attention
    (gemma2's softcap) records no kernel of either phase."""
    from autoport_cst.validate import validate_model

    port = broken_port(
        "        if not self._is_decode(attn_metadata):\n", "        if self._is_decode(attn_metadata):\n"
    )
    report = validate_model(port, tiny_llama, steps=2, config_variants=False)
    assert report.exit_code == 1 and report.failure is not None
    assert (
        "_forward_prefill is the prefill path of its module, called in a decode forward"
        in report.failure.message
    )
