"""The CPU stand-in: installation, weight loaders, checkpoint reader and NF
ops (semantics and the hardware constraints they enforce)."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from autoport_cst.validate.standin import functional as NF
from autoport_cst.validate.standin import standin_installed
from autoport_cst.validate.standin.checkpoints import (
    CheckpointKeyError,
    CheckpointShapeError,
    SafetensorsCheckpoint,
)
from autoport_cst.validate.standin.weight_loader import (
    TensorSlice,
    fused_qkv_weight_loader,
    scaled_bias_loader,
    set_weight_loader,
    sharding_weight_loader,
)

# -- installation ---------------------------------------------------------------


def test_installed_only_inside_the_block() -> None:
    assert "vllm_neuron" not in sys.modules
    with standin_installed() as installation:
        import vllm_neuron.functional as nf
        from vllm.distributed.parallel_state import get_tp_group
        from vllm_neuron.nn.embedding import VocabDimShardedEmbedding  # noqa: F401

        assert nf.qkv_proj is NF.qkv_proj
        group = get_tp_group()
        assert (group.world_size, group.rank_in_group) == (1, 0)
        assert set(installation.describe()["stand_in_packages"]) == {
            "vllm",
            "vllm_neuron",
            "nkilib",
            "nki",
            "libtorch_neuronx_lite",
        }
    roots = ("vllm", "vllm_neuron", "nkilib", "nki", "libtorch_neuronx_lite")
    assert not [name for name in sys.modules if name.split(".")[0] in roots]


def test_real_vllm_without_distributed_state_gets_the_getters(tmp_path: Path, monkeypatch) -> None:
    """A vLLM install without distributed state keeps its modules; only the
    parallel-state getters are replaced, and restored afterwards."""
    package = tmp_path / "vllm"
    (package / "distributed").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "distributed" / "__init__.py").write_text("")
    (package / "distributed" / "parallel_state.py").write_text(
        textwrap.dedent(
            """
            _TP = None
            def model_parallel_is_initialized():
                return _TP is not None
            def get_tp_group():
                raise AssertionError("tensor model parallel group is not initialized")
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import vllm.distributed.parallel_state as real

    original = real.get_tp_group
    try:
        with standin_installed() as installation:
            assert "vllm" in installation.describe()["real_packages"]
            from vllm.distributed.parallel_state import get_tp_group

            assert get_tp_group().world_size == 1
            assert sys.modules["vllm"].__file__.startswith(str(tmp_path))
        assert real.get_tp_group is original
    finally:
        for name in [n for n in sys.modules if n == "vllm" or n.startswith("vllm.")]:
            del sys.modules[name]


# -- weight loaders -------------------------------------------------------------------


def test_sharding_loader_transposed_storage() -> None:
    checkpoint = torch.arange(6 * 4, dtype=torch.float32).reshape(6, 4)  # [out, in]
    loader = sharding_weight_loader(shard_dim=1, shard_size=3, num_shards=2, is_storage_transposed=True)
    for rank in range(2):
        shard = loader.load([TensorSlice(checkpoint)], rank)
        assert torch.equal(shard, checkpoint[rank * 3 : rank * 3 + 3].T)


def test_sharding_loader_pads_the_last_shard() -> None:
    checkpoint = torch.ones(5, 2)
    loader = sharding_weight_loader(shard_dim=0, shard_size=3, num_shards=2, pad_shard=True)
    last = loader.load([TensorSlice(checkpoint)], 1)
    assert last.shape == (3, 2) and torch.equal(last[2], torch.zeros(2))


def test_fused_qkv_loader_with_kv_replicas() -> None:
    hidden, head = 4, 2
    q = torch.randn(4 * head, hidden)  # 4 q heads
    k = torch.randn(1 * head, hidden)  # 1 kv head, replicated on both ranks
    v = torch.randn(1 * head, hidden)
    loader = fused_qkv_weight_loader(
        q_size=2 * head,
        kv_size=head,
        shard_dim=1,
        num_shards=2,
        is_storage_transposed=True,
        num_kv_replicas=2,
    )
    for rank in range(2):
        fused = loader.load([TensorSlice(q), TensorSlice(k), TensorSlice(v)], rank)
        expected = torch.cat([q[rank * 2 * head : (rank + 1) * 2 * head].T, k.T, v.T], dim=1)
        assert torch.equal(fused, expected)


def test_scaled_bias_loader_divides() -> None:
    bias = torch.full((4,), 6.0)
    assert torch.equal(scaled_bias_loader(scale=2).load([TensorSlice(bias)], 0), torch.full((4,), 3.0))


# -- checkpoint reader ---------------------------------------------------------------


class _Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj_weight = torch.nn.Parameter(torch.empty(4, 6, device="meta"))
        set_weight_loader(
            self.proj_weight,
            sharding_weight_loader(shard_dim=0, shard_size=4, num_shards=1, is_storage_transposed=True),
        )
        self.norm = torch.nn.Parameter(torch.empty(4, device="meta"))


def _write(tmp_path: Path, tensors: dict[str, torch.Tensor]) -> Path:
    from safetensors.torch import save_file

    save_file(tensors, str(tmp_path / "model.safetensors"))
    return tmp_path


def test_checkpoint_loads_and_reports_unexpected(tmp_path: Path) -> None:
    weight = torch.randn(6, 4)
    _write(tmp_path, {"proj.weight": weight, "norm": torch.ones(4), "extra": torch.zeros(1)})
    result = SafetensorsCheckpoint(tmp_path).load_sharded_pipelined(
        0, 1, _Tiny(), {"proj_weight": "proj.weight"}, "cpu"
    )
    assert torch.equal(result.state_dict["proj_weight"], weight.T)
    assert result.missing_keys == [] and result.unexpected_keys == ["extra"]


def test_checkpoint_strict_missing_key_names_the_key(tmp_path: Path) -> None:
    _write(tmp_path, {"proj.weight": torch.randn(6, 4)})
    with pytest.raises(CheckpointKeyError, match=r"no tensor 'norm' for parameter 'norm'"):
        SafetensorsCheckpoint(tmp_path).load_sharded(0, 1, _Tiny(), {"proj_weight": "proj.weight"}, "cpu")
    result = SafetensorsCheckpoint(tmp_path).load_sharded(
        0, 1, _Tiny(), {"proj_weight": "proj.weight"}, "cpu", strict=False
    )
    assert result.missing_keys == ["norm"]


def test_checkpoint_shape_mismatch_names_the_key(tmp_path: Path) -> None:
    _write(tmp_path, {"proj.weight": torch.randn(5, 4), "norm": torch.ones(4)})
    with pytest.raises(
        CheckpointShapeError,
        match=r"'proj_weight' has shape \[4, 6\].*'proj\.weight' \[5, 4\] gives \[4, 5\]",
    ):
        SafetensorsCheckpoint(tmp_path).load_sharded(0, 1, _Tiny(), {"proj_weight": "proj.weight"}, "cpu")


# -- NF ops ------------------------------------------------------------------------


def _naive_causal(q, k, v, scale):
    scores = q @ k.transpose(-1, -2) * scale
    mask = torch.ones(scores.shape[-2:], dtype=torch.bool).tril()
    return torch.softmax(scores.masked_fill(~mask, float("-inf")), -1) @ v


def test_flash_attention_layouts_and_gqa() -> None:
    torch.manual_seed(0)
    q, k, v = torch.randn(4, 5, 8), torch.randn(2, 5, 8), torch.randn(2, 5, 8)
    out = NF.flash_attention(q.transpose(1, 2), k.transpose(1, 2), v, scale=0.3, tp_q=False, tp_out=True)
    expected = _naive_causal(q, k.repeat_interleave(2, 0), v.repeat_interleave(2, 0), 0.3)
    torch.testing.assert_close(out, expected.transpose(1, 2))


def test_decode_mask_needs_a_multiple_of_128() -> None:
    with pytest.raises(ValueError, match=r"s_prior \(96\) must be divisible by 128"):
        NF.gen_attention_decode_mask(torch.zeros(1, 1), bs=1, q_head=1, s_active=1, s_prior=96, block_len=32)


def _decode_inputs(batch=2, hidden=8, heads=2, kv_heads=1, head=4, block=32, blocks=4):
    torch.manual_seed(1)
    width = (heads + 2 * kv_heads) * head
    return {
        "X": torch.randn(batch, 1, hidden),
        "W_qkv": torch.randn(hidden, width),
        "K_cache": torch.randn(batch * blocks + 1, kv_heads, block, head),
        "V_cache": torch.randn(batch * blocks + 1, kv_heads, block, head),
        "active_blocks_table": torch.arange(1, batch * blocks + 1, dtype=torch.int32).reshape(batch, blocks),
        "W_out": torch.randn(heads * head, hidden),
    }


def test_attention_decode_rejects_a_1d_bias() -> None:
    inputs = _decode_inputs()
    mask = NF.gen_attention_decode_mask(
        torch.tensor([[5.0, 9.0]]), bs=2, q_head=2, s_active=1, s_prior=128, block_len=32
    )
    with pytest.raises(ValueError, match=r"Bias shape must be \[1, 8\], got \(8,\)"):
        NF.attention_decode(**inputs, attention_mask=mask, bias_out=torch.zeros(8))
    with pytest.raises(ValueError, match="active_blocks_table must be an int32"):
        NF.attention_decode(
            **{**inputs, "active_blocks_table": inputs["active_blocks_table"].long()}, attention_mask=mask
        )


@settings(max_examples=15, deadline=None, database=None)
@given(positions=st.lists(st.integers(min_value=0, max_value=127), min_size=2, max_size=2))
def test_attention_decode_equals_attention_over_the_visible_context(positions: list[int]) -> None:
    """Each sequence attends to its prior slots < position and to itself."""
    inputs = _decode_inputs()
    batch, head = 2, 4
    mask = NF.gen_attention_decode_mask(
        torch.tensor([positions], dtype=torch.float32),
        bs=batch,
        q_head=2,
        s_active=1,
        s_prior=128,
        block_len=32,
    )
    out, _k_new, _v_new = NF.attention_decode(**inputs, attention_mask=mask, softmax_scale=0.5)
    qkv = inputs["X"] @ inputs["W_qkv"]
    for b in range(batch):
        q = qkv[b, 0, : 2 * head].reshape(2, head)
        k_new, v_new = qkv[b, 0, 2 * head : 3 * head], qkv[b, 0, 3 * head :]
        table = inputs["active_blocks_table"][b].long()
        keys = inputs["K_cache"][table, 0].reshape(-1, head)[: positions[b]]
        values = inputs["V_cache"][table, 0].reshape(-1, head)[: positions[b]]
        keys, values = torch.cat([keys, k_new[None]]), torch.cat([values, v_new[None]])
        attn = torch.softmax(q @ keys.T * 0.5, -1) @ values
        torch.testing.assert_close(out[b], attn.reshape(-1) @ inputs["W_out"], rtol=1e-5, atol=1e-5)
