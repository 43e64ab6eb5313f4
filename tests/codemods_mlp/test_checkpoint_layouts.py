"""Checkpoint layouts: tensors stored [in, out] (GPT-2 Conv1D), fused tensors,
per-head fused QKV, and the composer's handling of tied embeddings."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from .conftest import plan_dict

pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch  # noqa: E402

from autoport_cst.apply import compose, load_reference  # noqa: E402
from autoport_cst.plan import parse_plan  # noqa: E402
from autoport_cst.validate import validate_model  # noqa: E402

STARCODER2_SPEC = {
    "norm": {"kind": "layernorm", "bias": True, "eps_key": "norm_epsilon"},
    "attention": {"qkv_bias": True, "o_bias": True},
    "rope": {"type": "default"},
    "mlp": {"kind": "plain", "activation": "gelu_tanh", "bias": True},
    "embedding": {"tied": True},
}


@pytest.fixture(scope="module")
def conv1d_checkpoint(checkpoints, tmp_path_factory) -> Path:
    """The tiny Starcoder2 checkpoint plus [in, out] copies of the MLP weights
    under other names (``mlp.c_fc_t``, ``mlp.c_proj_t``): transformers loads
    the usual tensors, the port reads only the transposed copies."""
    from safetensors.torch import load_file, save_file

    source = checkpoints.get("Starcoder2ForCausalLM")
    target = tmp_path_factory.mktemp("conv1d") / "checkpoint"
    shutil.copytree(source, target)
    path = target / "model.safetensors"
    state = load_file(str(path))
    for key in [k for k in state if k.endswith(("mlp.c_fc.weight", "mlp.c_proj.weight"))]:
        module = key.rsplit(".", 1)[0]
        state[f"{module}_t.weight"] = state[key].T.contiguous()
        state[f"{module}_t.bias"] = state[key.replace(".weight", ".bias")].clone()
    save_file(state, str(path), metadata={"format": "pt"})
    return target


def conv1d_plan(in_out: bool) -> dict:
    renames = {"mlp.up_proj": "mlp.c_fc_t", "mlp.down_proj": "mlp.c_proj_t"}
    params = {"renames": renames}
    if in_out:
        params["in_out_params"] = ["up_proj_weight", "down_proj_weight"]
    return plan_dict(
        f"conv1d_{'in_out' if in_out else 'out_in'}",
        "Starcoder2ForCausalLM",
        STARCODER2_SPEC,
        steps=[{"codemod": "checkpoint-keys", "params": params}],
        prefix="Starcoder2",
    )


@pytest.mark.parametrize("tp", [1, 2])
def test_in_out_checkpoint_tensors_load_untransposed(tp, ports, conv1d_checkpoint):
    # no config variants: a variant checkpoint, written by transformers, lacks the hand-made [in, out] copies
    report = validate_model(
        ports.build(conv1d_plan(True)), conv1d_checkpoint, tp=tp, dtype="fp32", config_variants=False
    )
    assert report.equivalent, report.summary()


def test_transposing_in_out_tensors_is_caught(ports, conv1d_checkpoint):
    """The pitfall: the usual transposing loaders on [in, out] tensors. The
    tiny model's MLP is square-free ([128, 64] vs [64, 128]), so the shapes
    disagree and loading stops with the parameter's name: the checkpoint is
    valid, so the port is wrong (exit 1), not the input."""
    report = validate_model(ports.build(conv1d_plan(False)), conv1d_checkpoint, tp=1, dtype="fp32", steps=2)
    assert not report.equivalent and report.exit_code == 1
    assert report.failure.stage == "load"
    assert "up_proj_weight" in report.failure.message or "down_proj_weight" in report.failure.message


def test_fused_loaders_split_by_rank():
    """``fused_qkv_split_loader`` and ``fused_part_loader`` (the code
    fused-checkpoint adds to a model file) give each rank the same rows as the
    separate-tensor loaders, for concatenated and per-head layouts, weights and
    biases, with KV heads replicated when there are fewer than ranks."""
    from autoport_cst.codemods.fused_checkpoint import PART_CODE, QKV_SPLIT_CODE

    from autoport_cst.validate.standin import weight_loader as wl

    namespace = {"torch": torch, "SafetensorsWeightLoader": wl.SafetensorsWeightLoader}
    exec(QKV_SPLIT_CODE, namespace)  # noqa: S102 - the generated loader code itself is under test
    exec(PART_CODE, namespace)  # noqa: S102
    split, part = namespace["fused_qkv_split_loader"], namespace["fused_part_loader"]
    hidden, head_dim, generator = 8, 4, torch.Generator().manual_seed(0)
    for heads, kv_heads, shards in [(4, 2, 2), (4, 1, 2), (4, 4, 2), (4, 2, 4), (4, 4, 1)]:
        q = torch.randn(heads * head_dim, hidden, generator=generator)
        k = torch.randn(kv_heads * head_dim, hidden, generator=generator)
        v = torch.randn(kv_heads * head_dim, hidden, generator=generator)
        q_size = heads // shards * head_dim
        replicas = max(1, shards // kv_heads)
        kv_size = max(1, kv_heads // shards) * head_dim
        separate = wl.fused_qkv_weight_loader(q_size, kv_size, 1, shards, True, replicas)
        concatenated = split(q_size, kv_size, shards, replicas, is_storage_transposed=True)
        for rank in range(shards):
            expected = separate.load([wl.TensorSlice(t) for t in (q, k, v)], rank)
            fused = wl.TensorSlice(torch.cat([q, k, v]))
            assert torch.equal(concatenated.load([fused], rank), expected)
            bias = split(q_size, kv_size, shards, replicas)
            biases = [t[:, 0].contiguous() for t in (q, k, v)]
            assert torch.equal(bias.load([wl.TensorSlice(torch.cat(biases))], rank), expected[0])
            if kv_heads == heads:
                per_head = torch.stack([t.view(heads, head_dim, hidden) for t in (q, k, v)], dim=1).reshape(
                    3 * heads * head_dim, hidden
                )
                loader = split(q_size, kv_size, shards, replicas, True, per_head=True, head_dim=head_dim)
                assert torch.equal(loader.load([wl.TensorSlice(per_head)], rank), expected)
    gate, up = torch.randn(16, hidden, generator=generator), torch.randn(16, hidden, generator=generator)
    for shards in (1, 2, 4):
        size = 16 // shards
        sharded = wl.sharding_weight_loader(1, size, shards, is_storage_transposed=True)
        for rank in range(shards):
            for index, tensor in enumerate((gate, up)):
                loader = part(index, 2, size, shards, is_storage_transposed=True)
                got = loader.load([wl.TensorSlice(torch.cat([gate, up]))], rank)
                assert torch.equal(got, sharded.load([wl.TensorSlice(tensor)], rank))


def test_tied_embeddings_are_config_driven():
    """llama3 reads tie_word_embeddings at load time: a tied target needs no
    codemod (the composer realizes it by config)."""
    reference = load_reference("llama3")
    for tied in (True, False):
        plan = parse_plan(plan_dict("demo", "DemoForCausalLM", {"embedding": {"tied": tied}}))
        composition = compose(plan, reference)
        assert [s.id for s in composition.steps] == ["rename-classes"]
        if tied != reference.spec.embedding.tied:
            assert "embedding.tied" in [d.path for d in composition.by_config]
