"""Rank arithmetic that the default layouts (TP=2 and data parallelism 2 of
one component at a time, ``parallel_checks``) cannot tell apart, and the
smallest layouts of four ranks that do. They cost a run of four rank
processes each (the TP=4 one on a checkpoint of its own, with its own
transformers run), so they are not default layouts: slow tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoport_cst.validate import validate_model

from .conftest import LLAMA3

pytestmark = pytest.mark.slow


def _run(port: Path, checkpoint: Path, **options):
    return validate_model(port, checkpoint, steps=2, config_variants=False, parallel_layouts=False, **options)


def test_the_decode_rows_gathered_for_the_lm_head_fail_at_tp2_with_mlp_dp2(
    broken_port, tiny_llama: Path
) -> None:
    # decode rows are replicated over TP: gathered, they are TP copies of the same rows, which
    # TP=2 alone samples the first of; with MLP DP 2 the rank's slice of the gathered MLP-DP
    # batch is then another replica's rows
    port = broken_port(
        "        if is_prefill and self.world_size > 1:\n            hidden_states = self.tp_group.all_gather(hidden_states, dim=0)\n"
        "            aux_hidden_states",
        "        if is_prefill or self.world_size > 1:\n            hidden_states = self.tp_group.all_gather(hidden_states, dim=0)\n"
        "            aux_hidden_states",
    )
    assert _run(port, tiny_llama, tp=2).equivalent
    assert _run(port, tiny_llama, mlp_dp=2).equivalent
    report = _run(port, tiny_llama, tp=2, mlp_dp=2)
    assert not report.equivalent and report.exit_code == 1
    assert _run(LLAMA3, tiny_llama, tp=2, mlp_dp=2).equivalent


def test_the_q_shard_of_a_negative_attention_rank_fails_at_tp4(broken_port, tmp_path: Path) -> None:
    # attention_dp_rank - rank * attention_dp_size equals the right shard modulo the shard
    # count tp * dp for every rank when tp is 2, whatever the attention-DP degree; TP=4 (on 8
    # heads: the rules want an even head count per rank) tells
    from autoport_cst.validate.tiny import build_tiny_checkpoint

    port = broken_port(
        "effective_q_rank = self.attention_dp_rank + self.rank * self.attention_dp_size",
        "effective_q_rank = self.attention_dp_rank - self.rank * self.attention_dp_size",
    )
    checkpoint = build_tiny_checkpoint(
        "LlamaForCausalLM", tmp_path / "tiny-8-heads", seed=0, dimensions={"num_attention_heads": 8}
    ).directory
    assert _run(port, checkpoint, tp=2).equivalent
    assert _run(port, checkpoint, tp=2, attention_dp=2).equivalent
    report = _run(port, checkpoint, tp=4)
    assert not report.equivalent and report.exit_code == 1
    assert report.first_diverging.component == "layers.0.attention", report.summary()
    assert _run(LLAMA3, checkpoint, tp=4).equivalent
