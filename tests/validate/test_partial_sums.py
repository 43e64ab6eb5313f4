"""``validate.partial_sums``: transformers' row-parallel projections, found
from the model's own tensor-parallel plan, computed as ``tp`` ranks compute
them."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from autoport_cst.validate.partial_sums import row_parallel_patterns, split_row_parallel  # noqa: E402


def _tiny_qwen2(dtype):
    config = transformers.Qwen2Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    torch.manual_seed(0)
    return transformers.Qwen2ForCausalLM(config).to(dtype).eval()


def test_the_plan_names_the_output_and_down_projections_under_any_prefix():
    patterns = row_parallel_patterns(transformers.Qwen2VLConfig())  # the plan sits on text_config
    names = [
        "model.language_model.layers.3.self_attn.o_proj",
        "model.layers.0.mlp.down_proj",
        "model.layers.0.self_attn.q_proj",
        "model.visual.blocks.0.attn.proj",
        "model.layers.0.self_attn.o_proj.lora",
    ]
    assert [any(p.search(n) for p in patterns) for n in names] == [True, True, False, False, False]


def test_in_float32_the_rank_sums_are_the_product():
    model = _tiny_qwen2(torch.float32)
    ids = torch.tensor([[1, 5, 9, 30, 2]])
    with torch.no_grad():
        expected = model(ids).logits
        changed = split_row_parallel(model, 2)
        got = model(ids).logits
    assert sorted(changed) == [
        f"model.layers.{i}.{m}" for i in range(2) for m in ("mlp.down_proj", "self_attn.o_proj")
    ]
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_in_bfloat16_each_rank_rounds_its_share():
    model = _tiny_qwen2(torch.bfloat16)
    linear = model.model.layers[0].self_attn.o_proj
    x = torch.randn(7, 32, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    with torch.no_grad():
        eager = linear(x)
        split_row_parallel(model, 2)
        summed = linear(x)
        halves = [
            torch.nn.functional.linear(x[:, i * 16 : (i + 1) * 16], linear.weight[:, i * 16 : (i + 1) * 16])
            for i in range(2)
        ]
    assert torch.equal(summed, halves[0] + halves[1])
    assert not torch.equal(summed, eager)  # the extra roundings a TP=2 port makes


def test_a_width_the_ranks_do_not_divide_is_left():
    model = _tiny_qwen2(torch.float32)
    assert split_row_parallel(model, 3) == []
