"""routed-scaling on the fused decode kernel: the validated ports that scale
their routed experts (GLM-4-MoE, Hunyuan v3, Dots1 in tests/coverage_moe)
also have a routing bias, which turns the fused decode kernel off. This
checks the other path on the ported experts class itself: the fused kernel's
scaled output equals the routing method's scaled affinities, and both are the
unscaled output times the factor."""

from __future__ import annotations

import dataclasses
import importlib

import pytest
import torch

from autoport_cst.apply import build_port, load_reference
from autoport_cst.apply.writer import write_port
from autoport_cst.plan import PLAN_VERSION, Plan, parse_plan, plan_to_json


@pytest.fixture(scope="module")
def scaled_port(tmp_path_factory):
    reference = load_reference("qwen3_moe")
    spec = dataclasses.replace(
        reference.spec, moe=dataclasses.replace(reference.spec.moe, routed_scaling_factor=2.5)
    )
    plan = Plan(
        version=PLAN_VERSION,
        name="scaled_moe",
        architecture="Qwen3MoeForCausalLM",
        reference="qwen3_moe",
        class_prefix="ScaledMoe",
        spec=spec,
    )
    plan = parse_plan(plan_to_json(plan), "<plan>")
    result = build_port(plan, reference)
    assert result.ok, result.failure
    assert "routed-scaling" in [s.codemod for s in result.steps]
    out = tmp_path_factory.mktemp("scaled-port")
    write_port(out, result.files, result.package_dir, force=True)
    return out / result.package_dir


def _experts(package, factor: float):
    model = importlib.import_module(f"{package.module.__name__}.model")
    config_module = importlib.import_module(f"{package.module.__name__}.config")
    config = config_module.ScaledMoeConfig.from_configs(
        {
            "hidden_size": 32,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "num_hidden_layers": 1,
            "vocab_size": 64,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 16,
            "routed_scaling_factor": factor,
            "torch_dtype": "float32",
        }
    )
    torch.manual_seed(0)
    experts = model.ScaledMoeExperts(config)
    with torch.no_grad():
        for parameter in experts.parameters():
            parameter.copy_(torch.randn_like(parameter) * 0.2)
    return experts


def test_fused_decode_and_routing_method_scale_alike(scaled_port):
    from autoport_cst.validate.package import imported_package
    from autoport_cst.validate.standin import standin_installed

    with standin_installed(), imported_package(scaled_port) as package:
        scaled = _experts(package, 2.5)
        plain = _experts(package, 1.0)
        x = torch.randn(6, 32, generator=torch.Generator().manual_seed(1))
        assert scaled.fused_decode
        fused = scaled.forward_decode(x)
        scaled.fused_decode = False
        routed = scaled.forward_decode(x)
        reference = plain.forward_decode(x)
    torch.testing.assert_close(fused, routed, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fused, 2.5 * reference, rtol=1e-5, atol=1e-5)
