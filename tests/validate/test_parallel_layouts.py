"""Whole-model runs with data and context parallelism (``layout``,
``layout_session``): the groups are vllm_neuron's, the staged llama3
reference validates under each layout, and a port that gets a layout's
sharding wrong diverges at the component that holds it.

Each multi-rank run starts ``tp x dp`` interpreters (about ten seconds on a
small machine): one fast run per layout family, the rest ``slow``."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from autoport_cst.cli.validate_cmd import validate_command
from autoport_cst.errors import InputError
from autoport_cst.validate import validate_model
from autoport_cst.validate.layout import ParallelLayout, check_layout, partitions
from autoport_cst.validate.scenario import Scenario
from tests.edited_copies import edited_copy

from .conftest import ROOT

LLAMA3 = ROOT / "reference_models" / "llama3"
# validations on one checkpoint share its transformers run (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("shared_reference_runs")

RUN = dict(steps=3, prompt_lengths=(8, 12, 20))


@pytest.fixture(scope="session")
def tiny_llama_one_kv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One KV head: replicated over a DCP group of two at TP 2."""
    from autoport_cst.validate.tiny import build_tiny_checkpoint

    directory = tmp_path_factory.mktemp("tiny-llama-kv1")
    build_tiny_checkpoint("LlamaForCausalLM", directory, seed=0, dimensions={"num_key_value_heads": 1})
    return directory


# -- the layout, without ranks --------------------------------------------------------------


def test_groups_follow_vllm_neuron_examples() -> None:
    # TP 8, DP 4: attention-DP columns across the replicas, TP supergroups spanning them
    parts = partitions(ParallelLayout(tp=8, attention_dp=4))
    assert parts["attention_dp"][:2] == [[0, 8, 16, 24], [1, 9, 17, 25]]
    assert parts["attention_tp"] == [list(range(32))]
    assert parts["tp"][1] == list(range(8, 16))
    assert parts["mlp_tp"] == [list(range(8 * d, 8 * d + 8)) for d in range(4)]  # no MLP DP: the TP groups
    # partial: MLP DP 2 inside DP 4 makes two supergroups and columns of two
    parts = partitions(ParallelLayout(tp=8, attention_dp=4, mlp_dp=2))
    assert parts["mlp_tp"] == [list(range(16)), list(range(16, 32))]
    assert parts["mlp_dp"][:2] == [[0, 8], [1, 9]] and [16, 24] in parts["mlp_dp"]
    # DCP inside TP: consecutive KV groups, strided DCP TP groups
    parts = partitions(ParallelLayout(tp=8, dcp=2))
    assert parts["dcp"] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert parts["dcp_tp"] == [[0, 2, 4, 6], [1, 3, 5, 7]]


def test_prefill_graph_is_plain_tp() -> None:
    layout = ParallelLayout(tp=2, attention_dp=2, mlp_dp=2)
    assert layout.world == 4 and layout.disaggregated
    assert layout.prefill_layout() == ParallelLayout(tp=2)
    dcp = ParallelLayout(tp=2, dcp=2, dcp_interleave=4, prefill_dcp=True)
    assert dcp.prefill_layout() == dcp and not dcp.decode_layout().prefill_dcp
    assert ParallelLayout(tp=2, dcp=2).prefill_layout() == ParallelLayout(tp=2)


def test_context_parallel_slots_deal_positions_in_runs() -> None:
    scenario = Scenario.build(512, 1, steps=2, block_size=4)
    table = scenario.layout.block_tables[0]
    layout = scenario.layout
    # width 2, runs of 1: even positions on rank 0, odd on rank 1, four per block
    owners = [0 if layout.cp_slot(table, p, 2, 1, 0) >= 0 else 1 for p in range(8)]
    assert owners == [0, 1] * 4
    assert [layout.cp_slot(table, p, 2, 1, 1) for p in (1, 3, 5, 7)] == [table[0] * 4 + k for k in range(4)]
    assert layout.cp_slot(table, 9, 2, 1, 1) == table[1] * 4  # the next virtual block
    # runs of 2: positions 0, 1, 4, 5 on rank 0
    assert [p for p in range(8) if layout.cp_slot(table, p, 2, 2, 0) >= 0] == [0, 1, 4, 5]
    assert layout.cp_slot(table, 3, 1, 1, 0) == layout.slot(table, 3)


def test_replicas_keep_the_cache_path_prompts_together() -> None:
    scenario = Scenario.build(512, 1, steps=2, cache_paths=True)
    every = scenario.sequences(True)
    assert scenario.replicas(every, 2) == [(0, 1), (2, 3, 4)]
    assert scenario.replicas(scenario.sequences(False), 2) == [(0, 1), (2,)]
    with pytest.raises(InputError, match="at least 4 prompts"):
        scenario.replicas(every, 4)


@pytest.mark.parametrize(
    "layout, config, message",
    [
        (ParallelLayout(tp=1, dcp=2), {}, "multiple of it"),
        (ParallelLayout(tp=2, dcp=2), {"num_attention_heads": 4, "num_key_value_heads": 2}, "replicated"),
        # multi-head attention under its own config names (Bloom's): 4 KV heads
        (ParallelLayout(tp=2, dcp=2, prefill_dcp=True), {"n_head": 4}, "the 4 KV heads must be replicated"),
        (ParallelLayout(tp=2, dcp=2, attention_dp=2), {}, "does not combine with --attention-dp"),
        (ParallelLayout(tp=4, dcp=2, prefill_dcp=True), {}, "--tp equal to --dcp"),
        (ParallelLayout(tp=1, prefill_dcp=True), {}, "need --dcp 2"),
        (ParallelLayout(tp=1, attention_dp=2, mlp_dp=3), {}, "must divide the largest"),
        (ParallelLayout(tp=4, attention_dp=4), {}, "16 ranks"),
        (ParallelLayout(tp=2, ep=2, mlp_dp=2), {}, "--ep does not combine"),
    ],
)
def test_layouts_vllm_neuron_does_not_serve_are_refused(layout, config, message) -> None:
    with pytest.raises(InputError, match=message):
        check_layout(layout, config, max_world=8)


def test_cli_refuses_a_dcp_layout_the_checkpoint_cannot_take(tiny_llama: Path) -> None:
    result = CliRunner().invoke(
        validate_command, [str(LLAMA3), "--hf", str(tiny_llama), "--tp", "2", "--dcp", "2"]
    )
    assert result.exit_code == 2
    assert "must be replicated over each DCP group" in result.output


# -- whole models over ranks ----------------------------------------------------------------


def _equivalent(report) -> None:
    assert report.equivalent, report.summary()
    assert report.settings["layout"]["world"] > 1
    decode = next(c for c in report.components if c["phase"] == "decode" and c["name"] == "logits")
    assert decode["rows"] == len(report.port_output.sequences) * RUN["steps"]


def test_attention_dp_with_kv_exchange(tiny_llama: Path) -> None:
    """TP 1, attention DP 2: 2 KV heads over 2 shards, so K/V are exchanged
    too (kv_needs_a2a); each replica decodes its own batch (one padded)."""
    report = validate_model(LLAMA3, tiny_llama, attention_dp=2, **RUN)
    _equivalent(report)
    groups = report.environment["stand_in"]["parallel_groups"]
    assert groups["decode"]["attention_dp"] == [0, 1] and groups["decode"]["tp"] == [0]
    assert "attention_dp" not in groups["prefill"] or groups["prefill"]["attention_dp"] == [0]
    assert report.port_output.sequences == [0, 1, 2, 3, 4]


def test_mlp_embedding_and_lm_head_dp(tiny_llama: Path) -> None:
    report = validate_model(LLAMA3, tiny_llama, mlp_dp=2, embedding_dp=2, lm_head_dp=2, **RUN)
    _equivalent(report)
    decode = report.environment["stand_in"]["parallel_groups"]["decode"]
    for component in ("mlp", "embedding", "lm_head"):
        assert decode[f"{component}_tp"] == [0, 1] and decode[f"{component}_dp"] == [0, 1]


def test_dcp_decode_fed_by_a_plain_prefill(tiny_llama_one_kv: Path) -> None:
    """The plain prefill cache re-laid into each DCP rank's share, in runs of 4."""
    report = validate_model(LLAMA3, tiny_llama_one_kv, tp=2, dcp=2, dcp_interleave=4, **RUN)
    _equivalent(report)
    assert report.settings["block_size"] == 16  # a virtual block of 32 holds the shared prefix
    assert report.environment["stand_in"]["parallel_groups"]["decode"]["dcp"] == [0, 1]


def test_dcp_with_a_context_parallel_prefill(tiny_llama_one_kv: Path) -> None:
    report = validate_model(LLAMA3, tiny_llama_one_kv, tp=2, dcp=2, prefill_dcp=True, **RUN)
    _equivalent(report)
    assert any(call["kind"] == "prefix_cache_hit" for call in report.settings["prefill_calls"])


# -- slow: every layout alone, and ports broken for one layout ------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    "options",
    [dict(mlp_dp=2), dict(embedding_dp=2), dict(lm_head_dp=2), dict(tp=2, attention_dp=2), dict(tp=2, dcp=2)],
)
def test_each_layout_alone(options, tiny_llama: Path, tiny_llama_one_kv: Path) -> None:
    checkpoint = tiny_llama_one_kv if "dcp" in options else tiny_llama
    _equivalent(validate_model(LLAMA3, checkpoint, **options, **RUN))


@pytest.mark.slow
def test_attention_dp_at_tp2_with_kv_exchange(tmp_path: Path) -> None:
    """8 heads, 4 KV heads over TP 2 x attention DP 2: kv_needs_a2a at TP 2."""
    from autoport_cst.validate.tiny import build_tiny_checkpoint

    checkpoint = build_tiny_checkpoint(
        "LlamaForCausalLM", tmp_path / "ckpt", dimensions={"num_attention_heads": 8, "num_key_value_heads": 4}
    ).directory
    _equivalent(validate_model(LLAMA3, checkpoint, tp=2, attention_dp=2, **RUN))


BROKEN = [
    # the O projection loaded at the TP rank instead of the TP x attention-DP rank
    ("rank=effective_q_rank,\n", "rank=self.rank,\n", dict(attention_dp=2), "layers.0.attention"),
    (
        "kv_sharded_across_attention_dp=self.kv_needs_a2a,",
        "kv_sharded_across_attention_dp=False,",
        dict(attention_dp=2),
        "layers.0.attention",
    ),
    (
        "gate_up_loader = with_rank_override(gate_up_loader, rank=self.mlp_tp_rank)",
        "gate_up_loader = with_rank_override(gate_up_loader, rank=self.rank)",
        dict(mlp_dp=2),
        "layers.0.mlp",
    ),
    (
        "embedding_rank = rank + (self.embedding_tp_rank - self.rank)",
        "embedding_rank = rank",
        dict(embedding_dp=2),
        "embedding",
    ),
    (
        "lm_head_loader = with_rank_override(lm_head_loader, rank=self.lm_head_tp_group.rank_in_group)",
        "lm_head_loader = with_rank_override(lm_head_loader, rank=self.rank)",
        dict(lm_head_dp=2),
        "logits",
    ),
    (
        "dcp_active_mask = (owner == rank).to(torch.float32)",
        "dcp_active_mask = (owner == 0).to(torch.float32)",
        dict(tp=2, dcp=2),
        "layers.0.attention",
    ),
    (
        "local_prior = None if cached_seq_len is None else cached_seq_len // self.dcp_size",
        "local_prior = cached_seq_len",
        dict(tp=2, dcp=2, prefill_dcp=True),
        "layers.0.attention",
    ),
]


@pytest.mark.slow
@pytest.mark.parametrize("old, new, options, component", BROKEN)
def test_a_port_broken_for_one_layout_diverges_there(
    old, new, options, component, tmp_path: Path, tiny_llama: Path, tiny_llama_one_kv: Path
) -> None:
    port = edited_copy(LLAMA3, tmp_path / "llama3", [(old, new)])
    checkpoint = tiny_llama_one_kv if "dcp" in options else tiny_llama
    report = validate_model(port, checkpoint, **options, **RUN)
    assert not report.equivalent
    assert report.first_diverging.component == component, report.summary()
    # the break shows only under the layout: the TP=1 run alone (no follow-up layouts) passes
    plain = validate_model(port, checkpoint, config_variants=False, parallel_layouts=False, **RUN)
    assert plain.equivalent, plain.summary()
