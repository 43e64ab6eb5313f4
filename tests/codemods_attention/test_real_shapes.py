"""The Q/K/V, q/k-norm and RoPE codemods on the real vllm_neuron structure:
loaders sharded by attention data parallelism, RoPE fused into the
projection, several prefill projections.

- the fused Q/K/V bias loader that add-qkv-bias writes gives every rank the
  bias of exactly the rows its weight loader gives it, attention data
  parallelism included (the generated loader called on tensors);
- the op-by-op projection that applies q/k norms over all heads computes
  what the kernel computes when it fuses the norms (per head);
- ports onto a reference whose RoPE is fused into ``NF.qkv_proj`` (the
  staged reference in the real structure) validate against transformers:
  per-head q/k norms fused into the kernel, and norms over all heads through
  the op-by-op projection, chunked prefill included.
"""

from __future__ import annotations

import itertools

import libcst as cst
import pytest
import torch

from autoport_cst.transform.base import run_example
from autoport_cst.validate import validate_model

from .conftest import ROOT
from .test_validations import example


def _generated_function(source: str, name: str, **names) -> object:
    """Execute the module-level function ``name`` of a codemod's output."""
    module = cst.parse_module(source)
    function = next(s for s in module.body if isinstance(s, cst.FunctionDef) and s.name.value == name)
    namespace = {"torch": torch, **names}
    exec(module.code_for_node(function), namespace)  # noqa: S102 - the generated code is under test
    return namespace[name]


# -- the Q/K/V bias under attention data parallelism ---------------------------------------


def _sharding(heads, kv_heads, tp, dp, kv_sharded):
    """The real llama3 attention's sizes for TP ``tp`` and attention DP ``dp``."""
    shards = tp * dp
    kv_per_rank, replicas = (1, tp // kv_heads) if tp >= kv_heads else (kv_heads // tp, 1)
    kv_for_weight = kv_heads // shards if kv_sharded else kv_per_rank
    return heads // shards, kv_for_weight, replicas


def test_qkv_bias_loader_shards_like_the_weight_loader_with_attention_dp():
    from autoport_cst.codemods.add_qkv_bias import AddQkvBias

    from autoport_cst.validate.standin import weight_loader as wl

    shaped = next(e for e in AddQkvBias.EXAMPLES if "attention data parallelism" in e.title)
    output, _ = run_example(AddQkvBias, shaped)
    # the bias loader is given every sharding argument of the weight loader
    for argument in (
        "attention_dp_rank=self.attention_dp_rank",
        "attention_dp_size=ddp",
        "kv_sharded_across_attention_dp=self.kv_needs_a2a",
        "num_kv_replicas=self.num_kv_replicas",
    ):
        assert output.count(argument) == 2, argument
    bias_loader = _generated_function(
        output, "fused_qkv_bias_loader", SafetensorsWeightLoader=wl.SafetensorsWeightLoader
    )
    head_dim, hidden, heads = 2, 3, 8
    checked = 0
    for kv_heads, tp, dp in itertools.product((1, 2, 4, 8), (1, 2, 4), (1, 2)):
        for kv_sharded in {False, dp > 1 and kv_heads > tp and kv_heads % (tp * dp) == 0}:
            q_heads, kv_for_weight, replicas = _sharding(heads, kv_heads, tp, dp, kv_sharded)
            q_size, kv_size = q_heads * head_dim, kv_for_weight * head_dim
            # each checkpoint row holds its own index: a rank's rows are visible in what it loads
            tensors = [
                torch.arange(n * head_dim, dtype=torch.float32)[:, None].expand(-1, hidden) + offset
                for n, offset in ((heads, 0), (kv_heads, 100), (kv_heads, 200))
            ]
            for dp_rank, tp_rank in itertools.product(range(dp), range(tp)):
                arguments = {
                    "num_kv_replicas": replicas,
                    "attention_dp_rank": dp_rank,
                    "attention_dp_size": dp,
                    "kv_sharded_across_attention_dp": kv_sharded,
                }
                weight = wl.fused_qkv_weight_loader(q_size, kv_size, 1, tp, True, **arguments)
                bias = bias_loader(q_size, kv_size, tp, **arguments)
                weights = weight.load([wl.TensorSlice(t) for t in tensors], tp_rank)  # [hidden, q | k | v]
                biases = bias.load([wl.TensorSlice(t[:, 0].contiguous()) for t in tensors], tp_rank)
                assert torch.equal(biases, weights[0]), (kv_heads, tp, dp, kv_sharded, dp_rank, tp_rank)
                checked += 1
    assert checked > 50


def test_output_bias_is_divided_by_the_ranks_that_sum_the_output_projection():
    """The O bias is added before the partial outputs are summed over the O
    weight's shards (TP x attention DP): its loader divides it by that many."""
    from autoport_cst.codemods.add_qkv_bias import AddQkvBias

    shaped = next(e for e in AddQkvBias.EXAMPLES if "attention data parallelism" in e.title)
    output, _ = run_example(AddQkvBias, shaped)
    assert "with_rank_override(scaled_bias_loader(scale=self.world_size * ddp), rank=q_rank)" in output


# -- norms over all heads, op by op --------------------------------------------------------


def test_op_by_op_projection_matches_the_kernel_norms():
    """``_qkv_proj_unfused`` with a per-head RMSNorm as ``qk_norm`` computes
    what ``NF.qkv_proj`` computes with its fused pre-RoPE norms and RoPE,
    and writes the same cache rows with ``use_block_kv``."""
    from autoport_cst.transform.edit.qkv import QKV_PROJ_UNFUSED_FUNCTION
    from autoport_cst.validate.standin import functional as NF
    from autoport_cst.validate.standin.common_types import NormType

    namespace = {"torch": torch, "NF": NF}
    exec(
        "def apply_rotary_pos_emb(q, k, cos, sin):\n"  # noqa: S102 - rotate-half RoPE as the references define it
        "    def rotate(x):\n"
        "        half = x.shape[-1] // 2\n"
        "        return torch.cat((-x[..., half:], x[..., :half]), dim=-1)\n"
        "    cos, sin = cos.unsqueeze(0), sin.unsqueeze(0)\n"
        "    return q * cos + rotate(q) * sin, k * cos + rotate(k) * sin\n",
        namespace,
    )
    exec(QKV_PROJ_UNFUSED_FUNCTION, namespace)  # noqa: S102
    unfused = namespace["_qkv_proj_unfused"]
    generator = torch.Generator().manual_seed(0)
    d, q_heads, kv_heads, hidden, tokens = 8, 4, 2, 16, 5
    x = torch.randn(1, tokens, hidden, generator=generator)
    w = torch.randn(hidden, (q_heads + 2 * kv_heads) * d, generator=generator)
    bias = torch.randn(1, w.shape[1], generator=generator)
    gamma_q, gamma_k = torch.rand(d, generator=generator) + 0.5, torch.rand(d, generator=generator) + 0.5
    angles = torch.outer(torch.arange(tokens, dtype=torch.float32), torch.rand(d // 2, generator=generator))
    cos = torch.cat((angles, angles), -1).cos()[None]
    sin = torch.cat((angles, angles), -1).sin()[None]

    def per_head(x, gamma):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * gamma

    common = {
        "hidden": x,
        "qkv_weights": w,
        "bias": bias,
        "d_head": d,
        "cos_cache": cos,
        "sin_cache": sin,
        "num_q_heads": q_heads,
        "num_kv_heads": kv_heads,
    }
    fused = NF.qkv_proj(
        **common,
        qk_norm_pre_rope_q_norm=NormType.RMS_NORM,
        qk_norm_pre_rope_k_norm=NormType.RMS_NORM,
        qk_norm_pre_rope_eps=1e-6,
        qk_norm_pre_rope_q_gamma=gamma_q.view(1, -1),
        qk_norm_pre_rope_k_gamma=gamma_k.view(1, -1),
    )
    ours = unfused(**common, qk_norm=lambda q, k: (per_head(q, gamma_q), per_head(k, gamma_k)))
    torch.testing.assert_close(ours, fused)
    caches = [torch.zeros(4, kv_heads, 4, d) for _ in range(4)]
    slots = torch.tensor([3, 4, 5, 9, 10], dtype=torch.int32)
    paged = {"use_block_kv": True, "block_size": 4, "slot_mapping": slots}
    q_kernel, *_ = NF.qkv_proj(
        **common,
        k_cache=caches[0],
        v_cache=caches[1],
        **paged,
        qk_norm_pre_rope_q_norm=NormType.RMS_NORM,
        qk_norm_pre_rope_k_norm=NormType.RMS_NORM,
        qk_norm_pre_rope_eps=1e-6,
        qk_norm_pre_rope_q_gamma=gamma_q.view(1, -1),
        qk_norm_pre_rope_k_gamma=gamma_k.view(1, -1),
    )
    q_ours, *_ = unfused(
        **common,
        k_cache=caches[2],
        v_cache=caches[3],
        **paged,
        qk_norm=lambda q, k: (per_head(q, gamma_q), per_head(k, gamma_k)),
    )
    torch.testing.assert_close(q_ours, q_kernel)
    torch.testing.assert_close(caches[2], caches[0])
    torch.testing.assert_close(caches[3], caches[1])


# -- ports onto a reference with RoPE fused into the projection -------------------------------


def _fused_rope_reference():
    """Our llama3 reference in the real structure (RoPE fused into
    ``NF.qkv_proj``, chunked prefill through ``use_block_kv``)."""
    for candidate in (ROOT / "reference_models" / "llama3",):
        model = candidate / "model.py"
        if model.exists() and "cos_cache=" in model.read_text() and "use_block_kv=True" in model.read_text():
            return candidate
    raise AssertionError("no llama3 reference with RoPE fused into NF.qkv_proj")


FUSED = [
    # (plan, checkpoint, what the port must contain)
    ("qwen3", {"model_type": "qwen3"}, "qk_norm_pre_rope_q_gamma=self.q_norm.weight"),
    ("olmo2", {"model_type": "olmo2"}, "_qkv_proj_unfused("),
]


@pytest.mark.parametrize("name, checkpoint, marker", FUSED, ids=[f[0] for f in FUSED])
@pytest.mark.parametrize("tp", [1, 2])
def test_qk_norm_ports_onto_fused_rope_validate(name, checkpoint, marker, tp, port_builder, tiny_checkpoint):
    package = port_builder(example(name), str(_fused_rope_reference()))
    assert marker in (package / "model.py").read_text()
    report = validate_model(package, tiny_checkpoint(checkpoint), dtype="fp32", steps=4, tp=tp)
    assert report.equivalent, report.summary()
