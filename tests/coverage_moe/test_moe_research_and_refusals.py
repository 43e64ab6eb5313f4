"""Research of the MoE architectures whose ports tests/coverage_moe/test_moe_ports_*.py
validate, and the MoE architectures and configs the planner refuses, with the
feature it names (tests/coverage_moe/moe_coverage.py)."""

from __future__ import annotations

import pytest

from autoport_cst.errors import UnrealizableDiffError

from .conftest import REFUSALS, build


def test_research_fills_the_moe_fields(tiny_moe):
    from autoport_cst.research import research

    glm = research(str(tiny_moe("Glm4MoeForCausalLM")))
    assert glm.spec.moe.dense_layers == (0,)
    assert glm.spec.moe.routed_scaling_factor == 2.5
    assert glm.spec.moe.routing_bias is True
    assert glm.spec.unsupported is None  # every group kept: no group restriction
    hy = research(str(tiny_moe("HYV3ForCausalLM")))
    assert hy.spec.moe.routed_scaling_factor == pytest.approx(2.826)
    assert hy.spec.moe.dense_layers == (0,) and hy.spec.moe.routing_bias is True
    ernie = research(str(tiny_moe("Ernie4_5_MoeForCausalLM")))
    assert ernie.spec.moe.routing_bias is True and ernie.spec.moe.routed_scaling_factor is None
    assert "moe_statics" in ernie.decision("moe.routing_bias").evidence
    aria = research(str(tiny_moe("AriaTextForCausalLM")))
    assert aria.spec.moe.dense_layers is None and aria.spec.moe.shared_experts == 1


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_named_refusal(tmp_path_factory, case):
    from autoport_cst.port import port
    from autoport_cst.research import research

    architecture, overrides, feature = REFUSALS[case]
    source = build(tmp_path_factory, architecture, overrides, f"refused-{case}")
    spec = research(str(source)).spec
    assert spec.unsupported is not None
    assert any(item.startswith(f"{feature}:") for item in spec.unsupported), spec.unsupported
    with pytest.raises(UnrealizableDiffError) as refused:
        port(str(source), "refused", tmp_path_factory.mktemp(f"refused-out-{case}"))
    assert "unsupported" in refused.value.fields
    assert not (tmp_path_factory.getbasetemp() / "refused" / "vllm_neuron").exists()


def test_group_limited_routing_without_latent_attention_is_refused_by_name(tmp_path_factory):
    """GLM-4-MoE restricting experts to the best groups: research reads the
    group limit (moe.group_limit, sum_top2), which only the deepseek_v3
    reference realizes, and GLM-4-MoE's attention is not latent attention:
    the port is refused naming the field and the codemod's missing site in
    qwen3_moe, nothing written."""
    from autoport_cst.port import port
    from autoport_cst.research import research

    overrides = {"n_group": 2, "topk_group": 1, "n_routed_experts": 8}
    source = build(tmp_path_factory, "Glm4MoeForCausalLM", overrides, "refused-glm4-moe-groups")
    assert research(str(source)).spec.moe.group_limit == "sum_top2"
    out = tmp_path_factory.mktemp("refused-glm4-moe-groups-out")
    with pytest.raises(UnrealizableDiffError) as refused:
        port(str(source), "refused_glm4_groups", out)
    assert "moe.group_limit" in str(refused.value) and "group-limit" in str(refused.value)
    assert not (out / "vllm_neuron").exists()
