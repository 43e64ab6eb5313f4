"""Norm placement on the MoE references, whose pre-MLP norm lives in the
experts class (next to the router, for the decode kernel to fuse it) rather
than in the decoder layer.

``norm-placement`` edits every site of that norm or refuses it: on qwen3_moe
post-norm removes it from both experts paths, guards the fused decode kernel
and turns decode to the unfused path; sandwich norms keep it and load it from
the pre-MLP norm's checkpoint key; gpt_oss, whose decode always runs the
fused kernel, is refused post-norm at that kernel call. FlexOlmo (OLMo 2's
post-norm on MoE layers) ports and validates; a copy of its port without the
post-norms fails validation. Kolibri 1 (sandwich norms) is refused for its
router, which adds the routing bias to the logits before the activation.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from autoport_cst.errors import PreconditionError
from autoport_cst.transform.base import PortContext, run_on_source
from autoport_cst.transform.library import get_codemod

from .conftest import build

REFERENCES = Path(__file__).resolve().parents[2] / "reference_models"


def _placed(reference: str, placement: str, source: str | None = None) -> str:
    cls = get_codemod("norm-placement")
    text = source if source is not None else (REFERENCES / reference / "model.py").read_text(encoding="utf-8")
    output, _ = run_on_source(
        cls(cls.parse_params({"placement": placement})), text, "model.py", "model", PortContext()
    )
    compile(output, "model.py", "exec")
    return output


def _class(source: str, name: str) -> str:
    start = source.index(f"class {name}(")
    end = source.find("\nclass ", start + 1)
    return source[start : end if end > 0 else len(source)]


def test_post_norm_removes_the_experts_norm_on_every_path():
    output = _placed("qwen3_moe", "post")
    experts = _class(output, "Qwen3MoeExperts")
    # no norm module left in the experts; decode runs the unfused path
    assert "self.post_attention_layernorm = " not in experts
    assert "self.fused_decode = False" in experts
    assert "normalized = hidden_states" in experts
    # the fused kernel, which normalizes its input, is guarded right before its call
    kernel = experts[experts.index("def _run_moe_block_tkg") :]
    assert kernel.index("raise NotImplementedError") < kernel.index("NF.moe_block_tkg(")
    prefill = experts[experts.index("def forward_prefill") : experts.index("def forward_decode")]
    assert "layernorm" not in prefill
    layer = _class(output, "Qwen3MoeDecoderLayer")
    assert "input_layernorm" not in layer
    # each forward (decode and prefill) norms both sublayer outputs
    assert layer.count("hidden_states = self.post_attention_layernorm(hidden_states)") == 2
    assert layer.count("hidden_states = self.post_feedforward_layernorm(hidden_states)") == 2
    loads = output[output.index("def load_weights(") :]
    assert "mlp.experts.post_attention_layernorm" not in loads and "input_layernorm" not in loads
    assert 'mappings[f"{prefix}.post_feedforward_layernorm.weight"]' in loads
    assert _placed("qwen3_moe", "post", output) == output


def test_sandwich_keeps_the_experts_norm_under_the_pre_mlp_key():
    output = _placed("qwen3_moe", "sandwich")
    experts = _class(output, "Qwen3MoeExperts")
    assert "self.fused_decode = True" in experts  # the fused kernel still computes the pre-MLP norm
    assert "self.post_attention_layernorm(hidden_states)" in experts
    layer = _class(output, "Qwen3MoeDecoderLayer")
    assert layer.count("hidden_states = self.input_layernorm(hidden_states)") == 2
    assert layer.count("hidden_states = self.post_feedforward_layernorm(hidden_states)") == 2
    entry = re.search(
        r'mappings\[f"\{prefix\}\.mlp\.experts\.post_attention_layernorm\.weight"\] = \(\s*([^)]*)\)', output
    )
    assert entry is not None and entry.group(1).strip() == 'f"{prefix}.pre_feedforward_layernorm.weight"'
    assert _placed("qwen3_moe", "sandwich", output) == output


def test_post_norm_is_refused_at_a_fused_kernel_without_an_unfused_path():
    with pytest.raises(PreconditionError) as refused:
        _placed("gpt_oss", "post")
    message = str(refused.value)
    assert "GptOssExperts._run_moe_block_tkg" in message and "fused_decode" in message
    assert re.search(r"model\.py:\d+:\d+", message), message


@pytest.fixture(scope="module")
def flex_olmo(tmp_path_factory, request):
    from tests.validation_depth import feature_depth, port_at_depth

    source = build(tmp_path_factory, "FlexOlmoForCausalLM", {}, "src-flex-olmo")
    out = tmp_path_factory.mktemp("out-flex-olmo")
    return port_at_depth(
        feature_depth(request.config), str(source), "cov_flex_olmo", out, tp=1, steps=8, force=True
    )


def test_flex_olmo_ports_with_post_norms(flex_olmo):
    assert flex_olmo.reference == "qwen3_moe"
    assert "norm-placement" in flex_olmo.steps
    runs = {run.dtype: run for run in flex_olmo.runs if run.tp == 1}
    assert runs["fp32"].equivalent, runs["fp32"].summary
    assert runs["bf16"].equivalent, runs["bf16"].summary


def test_flex_olmo_without_its_post_norms_fails_validation(flex_olmo, tmp_path):
    from autoport_cst.validate.api import validate_model

    package = tmp_path / Path(flex_olmo.package_dir).name
    shutil.copytree(flex_olmo.package_dir, package)
    model = package / "model.py"
    text = model.read_text(encoding="utf-8")
    removed = re.sub(
        r"\n *hidden_states = self\.post_(attention|feedforward)_layernorm\(hidden_states\)", "", text
    )
    assert removed != text
    model.write_text(removed, encoding="utf-8")
    report = validate_model(
        package, flex_olmo.checkpoint_dir, steps=4, config_variants=False, parallel_layouts=False
    )
    assert not report.equivalent


@pytest.mark.slow
def test_flex_olmo_validates_on_two_ranks(tmp_path_factory):
    from autoport_cst.port import port

    source = build(tmp_path_factory, "FlexOlmoForCausalLM", {}, "src-flex-olmo-tp2")
    outcome = port(
        str(source), "cov_flex_olmo", tmp_path_factory.mktemp("out-flex-olmo-tp2"), tp=2, steps=8, force=True
    )
    tp2 = [run for run in outcome.runs if run.tp == 2]
    assert tp2 and all(run.equivalent for run in tp2), [run.summary for run in tp2]


def test_kolibri_is_refused_for_its_routing_bias_on_the_logits(tmp_path_factory):
    from autoport_cst.research import research

    spec = research(str(build(tmp_path_factory, "Kolibri1ForCausalLM", {}, "src-kolibri1"))).spec
    assert spec.norm.placement == "sandwich"
    assert spec.unsupported is not None
    assert [i for i in spec.unsupported if i.startswith("routing_bias_on_logits:")], spec.unsupported


def _with_dense_layers() -> str:
    cls = get_codemod("dense-layers")
    text = (REFERENCES / "qwen3_moe" / "model.py").read_text(encoding="utf-8")
    output, _ = run_on_source(cls(cls.parse_params({})), text, "model.py", "model", PortContext())
    return output


def test_sandwich_loads_the_dense_mlp_norm_from_the_pre_mlp_key():
    # dense-layers builds Qwen3MoeDenseMLP (holding the pre-MLP norm) on the dense layers
    output = _placed("qwen3_moe", "sandwich", _with_dense_layers())
    dense = _class(output, "Qwen3MoeDenseMLP")
    assert "self.post_attention_layernorm(hidden_states.to(self.dtype))" in dense
    loads = output[output.index("def load_weights(") :]
    assert (
        'mappings[f"{prefix}.mlp.post_attention_layernorm.weight"] = f"{prefix}.pre_feedforward_layernorm.weight"'
        in loads
    )
    entry = re.search(
        r'mappings\[f"\{prefix\}\.mlp\.experts\.post_attention_layernorm\.weight"\] = \(\s*([^)]*)\)', loads
    )
    assert entry is not None and entry.group(1).strip() == 'f"{prefix}.pre_feedforward_layernorm.weight"'
    assert 'f"{prefix}.post_attention_layernorm.weight"' in loads  # the layer's own post-attention norm
    layer = _class(output, "Qwen3MoeDecoderLayer")
    assert layer.count("hidden_states = self.post_feedforward_layernorm(hidden_states)") == 2
    assert _placed("qwen3_moe", "sandwich", output) == output


def test_post_norm_removes_the_dense_mlp_norm():
    output = _placed("qwen3_moe", "post", _with_dense_layers())
    dense = _class(output, "Qwen3MoeDenseMLP")
    assert "layernorm" not in dense
    assert "hidden_states = hidden_states.to(self.dtype)" in dense
    loads = output[output.index("def load_weights(") :]
    assert (
        ".mlp.post_attention_layernorm" not in loads and ".mlp.experts.post_attention_layernorm" not in loads
    )
