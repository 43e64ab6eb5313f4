"""Expert parallelism: the gpt_oss experts' loaders (which experts and which
slice a rank keeps, the de-interleaved gate/up layout, the +1 of the up bias)
and the ``--ep`` option of validation (what it refuses, with exit code 2)."""

from __future__ import annotations

import importlib
import json
import shutil
from types import SimpleNamespace

import pytest
import torch
from click.testing import CliRunner

from autoport_cst.cli import cli
from autoport_cst.errors import InputError
from autoport_cst.validate import validate_model
from autoport_cst.validate.standin import parallel_state, standin_installed, vllm_config
from autoport_cst.validate.standin.collectives import LOCAL_GROUP
from autoport_cst.validate.standin.weight_loader import TensorSlice, get_weight_loader

from .conftest import GPT_OSS, ROOT

EXPERTS, HIDDEN, INTER = 4, 8, 6


def _experts(ep_degree: int, ep_rank: int, partition_size: int):
    """A GptOssExperts of the reference as rank ``ep_rank`` of ``ep_degree``
    EP partitions (``partition_size`` ranks share one) would build it: the
    stand-in's EP getters are pointed at that layout (the groups themselves
    are never used by the loaders)."""
    from autoport_cst.validate.package import imported_package

    group = SimpleNamespace(world_size=partition_size, rank_in_group=0, ranks=list(range(partition_size)))
    with standin_installed(), imported_package(GPT_OSS) as package:
        parallel_state._EP = parallel_state._ExpertParallel(
            degree=ep_degree, rank=ep_rank, tp_group=group, group=None
        )
        vllm_config.configure(ep_degree * partition_size, enable_expert_parallel=ep_degree > 1)
        model_module = importlib.import_module(f"{package.module.__name__}.model")
        config = model_module.GptOssConfig(
            hidden_size=HIDDEN,
            num_local_experts=EXPERTS,
            num_experts_per_tok=2,
            intermediate_size=INTER,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=4,
            torch_dtype=torch.float32,
        )
        return model_module.GptOssExperts(config)


def _load(param, tensor, rank):
    return get_weight_loader(param).load([TensorSlice(tensor)], rank)


def test_expert_parallel_rank_keeps_its_experts_whole():
    """EP degree 2 over two ranks: EP rank 1 holds experts 2 and 3, with
    their full intermediate dimension, gate and up de-interleaved."""
    experts = _experts(ep_degree=2, ep_rank=1, partition_size=1)
    assert experts.num_local_experts == 2 and experts.local_expert_start == 2
    assert tuple(experts.gate_up_proj_weight.shape) == (2, HIDDEN, 2 * INTER)
    gate_up = torch.randn(EXPERTS, HIDDEN, 2 * INTER)  # gate = even columns, up = odd
    loaded = _load(experts.gate_up_proj_weight, gate_up, rank=1)
    assert torch.equal(loaded[:, :, :INTER], gate_up[2:, :, 0::2])
    assert torch.equal(loaded[:, :, INTER:], gate_up[2:, :, 1::2])
    bias = torch.randn(EXPERTS, 2 * INTER)
    loaded_bias = _load(experts.gate_up_proj_bias, bias, rank=1)
    assert torch.equal(loaded_bias[:, :INTER], bias[2:, 0::2])
    assert torch.allclose(loaded_bias[:, INTER:], bias[2:, 1::2] + 1)  # (up + 1) folded in
    down = torch.randn(EXPERTS, INTER, HIDDEN)
    assert torch.equal(_load(experts.down_proj_weight, down, rank=1), down[2:])
    down_bias = torch.randn(EXPERTS, HIDDEN)
    assert torch.equal(_load(experts.down_proj_bias, down_bias, rank=1), down_bias[2:])
    router = torch.randn(EXPERTS, HIDDEN)
    assert torch.equal(_load(experts.router_weight, router, rank=1), router)  # replicated


def test_expert_partition_shared_by_two_ranks():
    """EP degree 2 over four ranks: global rank 3 is EP rank 1 and the second
    rank of its partition: experts 2 and 3, second half of the intermediate
    dimension, the down bias halved."""
    experts = _experts(ep_degree=2, ep_rank=1, partition_size=2)
    half = INTER // 2
    assert experts.intermediate_size_per_rank == half
    gate_up = torch.randn(EXPERTS, HIDDEN, 2 * INTER)
    loaded = _load(experts.gate_up_proj_weight, gate_up, rank=3)
    assert torch.equal(loaded[:, :, :half], gate_up[2:, :, 0::2][:, :, half:])
    assert torch.equal(loaded[:, :, half:], gate_up[2:, :, 1::2][:, :, half:])
    down = torch.randn(EXPERTS, INTER, HIDDEN)
    assert torch.equal(_load(experts.down_proj_weight, down, rank=3), down[2:, half:])
    down_bias = torch.randn(EXPERTS, HIDDEN)
    assert torch.allclose(_load(experts.down_proj_bias, down_bias, rank=3), down_bias[2:] / 2)


def test_without_expert_parallelism_every_rank_holds_every_expert():
    experts = _experts(ep_degree=1, ep_rank=0, partition_size=2)
    assert experts.ep_degree == 1 and experts.num_local_experts == EXPERTS
    assert experts.tp_degree == 1  # the stand-in's TP group here is one process
    gate_up = torch.randn(EXPERTS, HIDDEN, 2 * INTER)
    assert _load(experts.gate_up_proj_weight, gate_up, rank=0).shape == (EXPERTS, HIDDEN, 2 * INTER)


def test_stand_in_layout_of_expert_parallelism():
    """On one process EP cannot be laid out; the default is off, and the
    getters say so."""
    parallel_state.configure(LOCAL_GROUP)
    try:
        assert parallel_state.get_neuron_ep_degree() == 1
        assert parallel_state.get_neuron_ep_rank() == 0
        assert parallel_state.get_neuron_ep_tp_group() is parallel_state.get_tp_group()
        assert parallel_state.expert_parallel_layout() is None
        with pytest.raises(ValueError, match="does not divide"):
            parallel_state.configure(LOCAL_GROUP, ep_degree=2)
    finally:
        parallel_state.reset()


@pytest.mark.parametrize(
    "tp, ep, message",
    [
        (1, 2, "--ep 2 needs --tp to be a multiple of it"),
        (2, 3, "--ep 3 needs --tp to be a multiple of it"),
        (2, 0, "--ep must be a positive integer"),
    ],
)
def test_invalid_expert_parallelism_is_bad_input(tiny_gpt_oss, tp, ep, message):
    with pytest.raises(InputError, match=message):
        validate_model(GPT_OSS, tiny_gpt_oss, tp=tp, ep=ep)


def test_experts_that_do_not_split_into_the_partitions_are_bad_input(tiny_gpt_oss, tmp_path):
    """Three experts in two EP partitions, at a TP size the tensor-parallel
    rules accept (the tiny model's 4 heads allow TP 1 and 2 only, so its own
    4 experts always split): the config says 3, which is all the check reads
    before anything is loaded."""
    checkpoint = tmp_path / "three-experts"
    shutil.copytree(tiny_gpt_oss, checkpoint)
    config = json.loads((checkpoint / "config.json").read_text(encoding="utf-8"))
    config["num_local_experts"] = 3
    (checkpoint / "config.json").write_text(json.dumps(config), encoding="utf-8")
    with pytest.raises(InputError, match="the 3 experts of .* do not split into 2 equal partitions"):
        validate_model(GPT_OSS, checkpoint, tp=2, ep=2)


def test_expert_parallelism_needs_a_mixture_of_experts(tmp_path):
    from autoport_cst.validate import build_tiny_checkpoint

    build_tiny_checkpoint("LlamaForCausalLM", tmp_path / "llama", seed=0)
    with pytest.raises(InputError, match="needs a mixture-of-experts checkpoint"):
        validate_model(ROOT / "reference_models" / "llama3", tmp_path / "llama", tp=2, ep=2)


def test_cli_exit_code_2_on_invalid_ep(tiny_gpt_oss):
    result = CliRunner().invoke(
        cli, ["validate", str(GPT_OSS), "--hf", str(tiny_gpt_oss), "--tp", "2", "--ep", "3"]
    )
    assert result.exit_code == 2, result.output
    assert "--ep 3" in result.output


EP_SWITCH = "self.ep_enabled = parallel_config.enable_expert_parallel"


def _validate_cli(package, checkpoint, *options):
    return CliRunner().invoke(
        cli, ["validate", str(package), "--hf", str(checkpoint), "--tp", "2", "--steps", "2", *options]
    )


def test_qwen3_moe_validates_with_expert_parallelism(tmp_path):
    """The qwen3_moe reference lays its experts out by EP rank inside the TP
    world, as gpt_oss does."""
    from autoport_cst.validate import build_tiny_checkpoint

    build_tiny_checkpoint("Qwen3MoeForCausalLM", tmp_path / "qwen3-moe", seed=0, keep_layer_kinds=True)
    result = _validate_cli(ROOT / "reference_models" / "qwen3_moe", tmp_path / "qwen3-moe", "--ep", "2")
    assert result.exit_code == 0, result.output


def test_a_port_without_expert_parallelism_is_refused_with_ep(tmp_path):
    """A port that never reads the EP degree (the qwen3_moe reference with
    its EP switch turned off): asking for EP is bad input for it (exit 2),
    not a silent MoE-inside-TP run."""
    from autoport_cst.validate import build_tiny_checkpoint

    build_tiny_checkpoint("Qwen3MoeForCausalLM", tmp_path / "qwen3-moe", seed=0, keep_layer_kinds=True)
    package = tmp_path / "qwen3_moe_no_ep"
    shutil.copytree(ROOT / "reference_models" / "qwen3_moe", package)
    model = (package / "model.py").read_text(encoding="utf-8")
    assert model.count(EP_SWITCH) == 1
    (package / "model.py").write_text(model.replace(EP_SWITCH, "self.ep_enabled = False"), encoding="utf-8")
    result = _validate_cli(package, tmp_path / "qwen3-moe", "--ep", "2")
    assert result.exit_code == 2, result.output
    assert "does not implement expert parallelism" in result.output
