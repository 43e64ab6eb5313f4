"""The default layouts of four ranks (``parallel_checks``): TP=2 with MLP DP 2
on the checkpoint, and TP=4 with the KV heads replicated over the TP ranks.
Rank arithmetic that TP=2 and data parallelism 2 of one component at a time
cannot tell apart fails the default validation there (mutation survivors
phi3:336 and qwen2:1057 of ``benchmarks/mutation.py``, the same edits made to
the llama3 reference, which the phi3 and qwen2 ports are applied on); the
unmutated reference passes every default layout (``test_parallel_checks``)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from autoport_cst.errors import InputError
from autoport_cst.validate import validate_model
from autoport_cst.validate.parallel_checks import (
    LAYOUTS,
    REPLICATED_KV,
    REPLICATED_KV_HEADS,
    check_parallel_layouts,
    replicated_kv_run,
)

TP2_MLP_DP2 = "TP=2 with MLP DP 2"


def _run(port: Path, checkpoint: Path, **options):
    return validate_model(port, checkpoint, steps=2, config_variants=False, **options)


def _labels(report) -> list[tuple[str, bool | None]]:
    return [(e["label"], e["equivalent"]) for e in report.parallel_layouts]


def test_the_decode_rows_gathered_over_tp_fail_the_default_at_tp2_with_mlp_dp2(
    broken_port, tiny_llama: Path
) -> None:
    # qwen2:1057. Decode rows are replicated over TP: gathered, they are TP copies of the same
    # rows, whose first are the right ones at TP=2 alone; with MLP DP 2 a rank keeps its
    # MLP-DP slice of the gathered batch, another replica's rows
    port = broken_port(
        "        if is_prefill and self.world_size > 1:\n            hidden_states = self.tp_group.all_gather(hidden_states, dim=0)\n"
        "            aux_hidden_states",
        "        if is_prefill or self.world_size > 1:\n            hidden_states = self.tp_group.all_gather(hidden_states, dim=0)\n"
        "            aux_hidden_states",
    )
    report = _run(port, tiny_llama)
    assert not report.equivalent and report.exit_code == 1
    labels = _labels(report)
    assert labels[-1] == (TP2_MLP_DP2, False), report.parallel_layouts
    # every earlier default layout, TP=2 and the MLP's DP 2 among them, passes it; the later are not run
    earlier = [label for label, _ in LAYOUTS][: [label for label, _ in LAYOUTS].index(TP2_MLP_DP2)]
    assert labels[:-1] == [(label, True) for label in earlier], report.parallel_layouts
    assert report.summary().startswith(f"not equivalent: {TP2_MLP_DP2}: "), report.summary()


def test_a_q_shard_of_a_negative_tp_rank_fails_the_default_with_kv_heads_replicated(
    broken_port, tiny_llama: Path
) -> None:
    # phi3:336. attention_dp_rank - rank * attention_dp_size equals the right shard modulo
    # the shard count tp * dp for every rank when tp is 2, whatever the attention-DP degree;
    # TP=4 tells (on the stand-in checkpoint of 8 heads: the rules want an even head count
    # per rank, and the tiny checkpoint has 4)
    port = broken_port(
        "effective_q_rank = self.attention_dp_rank + self.rank * self.attention_dp_size",
        "effective_q_rank = self.attention_dp_rank - self.rank * self.attention_dp_size",
    )
    report = _run(port, tiny_llama)
    assert not report.equivalent and report.exit_code == 1
    assert _labels(report) == [(label, True) for label, _ in LAYOUTS] + [(REPLICATED_KV[0], False)]
    assert report.summary().startswith(f"not equivalent: {REPLICATED_KV[0]}: "), report.summary()
    assert report.first_diverging.component == "layers.0.attention", report.summary()


def test_the_replicated_kv_run_comes_after_the_layouts_and_a_refusal_is_not_run() -> None:
    passing = SimpleNamespace(equivalent=True, failure=None, summary=lambda: "equivalent within tolerances")

    def refused():
        raise InputError("--tp 4: TP 4 breaks the tensor-parallel rules: rule 1\n(more)")

    report = SimpleNamespace(parallel_layouts=[], equivalent=True)
    check_parallel_layouts(report, lambda **_options: passing, experts=4, replicated_kv=refused)
    assert report.equivalent
    kv = report.parallel_layouts[len(LAYOUTS)]
    assert kv == {
        "label": REPLICATED_KV[0],
        "equivalent": None,
        "summary": "not run: --tp 4: TP 4 breaks the tensor-parallel rules: rule 1",
    }
    assert report.parallel_layouts[-1]["label"] == "EP 2 at TP=2"


def test_a_checkpoint_that_takes_tp4_with_fewer_kv_heads_is_run_itself(tmp_path: Path) -> None:
    config = {"num_attention_heads": 8, "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 512}
    (tmp_path / "config.json").write_text(json.dumps(config), encoding="utf-8")
    seen: list[tuple[Path, dict]] = []
    replicated_kv_run(lambda checkpoint, **options: seen.append((checkpoint, options)), tmp_path)
    assert seen == [(tmp_path, REPLICATED_KV[1])]


def test_the_tiny_checkpoint_is_stood_in_for_by_one_of_eight_heads(tiny_llama: Path) -> None:
    # 4 heads at TP=4 is one head per rank, which the rules refuse (rule 2)
    seen: list[dict] = []

    def validate_on(checkpoint: Path, **options):
        config = json.loads((Path(checkpoint) / "config.json").read_text(encoding="utf-8"))
        seen.append({"options": options, "directory": Path(checkpoint), "config": config})

    replicated_kv_run(validate_on, tiny_llama)
    (run,) = seen
    original = json.loads((tiny_llama / "config.json").read_text(encoding="utf-8"))
    assert original["num_attention_heads"] == 4 and original["num_key_value_heads"] == 2
    assert run["options"] == REPLICATED_KV[1]
    assert {k: run["config"][k] for k in REPLICATED_KV_HEADS} == REPLICATED_KV_HEADS
    assert run["config"]["architectures"] == original["architectures"]
    assert not run["directory"].exists()  # removed after the run


def test_multi_head_attention_has_no_kv_heads_to_replicate(tmp_path: Path) -> None:
    # GPT-NeoX's config: no num_key_value_heads, as many KV heads as heads
    config = {"num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 512}
    (tmp_path / "config.json").write_text(json.dumps(config), encoding="utf-8")
    with pytest.raises(InputError, match="multi-head attention"):
        replicated_kv_run(lambda *_a, **_k: pytest.fail("run"), tmp_path)


def test_the_stand_in_checkpoint_keeps_the_checkpoints_vocabulary(tmp_path: Path) -> None:
    """A vocabulary the four ranks divide stays one they divide: the stand-in
    was built with the tiny default (511), and a port whose LM head needs a
    vocabulary the TP size divides (vllm_neuron's llama3 and qwen3:
    ColumnParallelLinear over config.vocab_size) failed the run at build on a
    checkpoint of 512."""
    from autoport_cst.validate.tiny import build_tiny_checkpoint

    build_tiny_checkpoint("LlamaForCausalLM", tmp_path / "v512", seed=0, dimensions={"vocab_size": 512})
    seen: list[dict] = []

    def validate_on(checkpoint: Path, **options):
        seen.append(json.loads((Path(checkpoint) / "config.json").read_text(encoding="utf-8")))

    replicated_kv_run(validate_on, tmp_path / "v512")
    (config,) = seen
    assert config["vocab_size"] == 512
    assert {k: config[k] for k in REPLICATED_KV_HEADS} == REPLICATED_KV_HEADS


def test_a_stand_in_the_ports_config_guards_refuse_is_not_run(tiny_llama: Path) -> None:
    """Helium's port is made for its head_dim of 16; the stand-in of 8 heads
    over the same width has 8: the guard's refusal says the layout cannot run
    on the stand-in, not that the port is wrong. Any other build failure on
    it still fails the layout."""
    from autoport_cst.validate.report import PortFailureInfo

    def failing(message: str, raised_in: str | None):
        def validate_on(_checkpoint: Path, **_options):
            failure = PortFailureInfo("build", message, raised_in=raised_in)
            return SimpleNamespace(equivalent=False, failure=failure)

        return validate_on

    guard = (
        "rank 0: ValueError: config field head_dim is 8, but this port was made for head_dim = 16 "
        "(unsupported fixed in its code): port this checkpoint again (at /p/config.py:74, in "
        "check_assumed_config) while building the model on the meta device"
    )
    with pytest.raises(InputError, match="the port's config guards refuse .*config field head_dim is 8"):
        replicated_kv_run(failing(guard, "check_assumed_config"), tiny_llama)
    other = "rank 0: AttributeError: no attribute 'qkv' (at /p/model.py:12, in __init__) while building"
    assert replicated_kv_run(failing(other, "__init__"), tiny_llama).failure.message == other
    # what the port's code raised in, not what its message says: a crash elsewhere that quotes the
    # guard's name still fails the layout
    quoting = "rank 0: KeyError: 'in check_assumed_config)' (at /p/model.py:12, in __init__) while building"
    assert replicated_kv_run(failing(quoting, "__init__"), tiny_llama).failure.message == quoting


@pytest.mark.slow
def test_the_helium_port_validates_with_its_head_dim_guarded(tmp_path: Path) -> None:
    """``port`` of a tiny Helium guards its head_dim (16); the TP=4 stand-ins
    (8 heads over the same width: head_dim 8) are reported as not run
    (test_a_stand_in_the_ports_config_guards_refuse_is_not_run) where the port
    failed to validate before."""
    from autoport_cst.port import port
    from autoport_cst.validate.tiny import build_tiny_checkpoint

    build_tiny_checkpoint("HeliumForCausalLM", tmp_path / "src", seed=0)
    outcome = port(str(tmp_path / "src"), "helium", tmp_path / "out", steps=4)
    assert outcome.validated, [(r.tp, r.dtype, r.first_diverging) for r in outcome.runs]
