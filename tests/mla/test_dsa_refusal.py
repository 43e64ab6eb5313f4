"""DeepSeek Sparse Attention (DeepSeek-V3.2, GLM-MoE-DSA, A.X-K2): the
attention's lightning indexer (a child module scoring every key per query
and keeping the best ``index_topk``) is what refuses the port, found from
the code: the attention is not read as a mixture of experts because a child
takes a top-k, and the refusal names the indexer (unsupported
``sparse_indexer``). A top-k router inside an MoE block stays a router."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")

from autoport_cst.research.refusal import blockers  # noqa: E402

TINY = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "moe_intermediate_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "kv_lora_rank": 32,
    "q_lora_rank": 48,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "head_dim": 8,
    "v_head_dim": 16,
    "n_routed_experts": 4,
    "n_shared_experts": 1,
    "num_experts_per_tok": 2,
    "first_k_dense_replace": 1,
    "index_n_heads": 2,
    "index_head_dim": 16,
    "index_topk": 4,
    "vocab_size": 256,
}


def _research(tmp_path: Path, model_type: str):
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from autoport_cst.research import research

    config = AutoConfig.for_model(model_type, **TINY).to_dict()
    config["architectures"] = [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type]]
    directory = tmp_path / model_type
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(config))
    return research(str(directory))


@pytest.mark.parametrize("model_type", ["deepseek_v32", "glm_moe_dsa"])
def test_the_lightning_indexer_is_named(tmp_path, model_type):
    result = _research(tmp_path, model_type)
    unsupported = result.spec.unsupported or ()
    assert any(item.startswith("sparse_indexer:") and "indexer" in item for item in unsupported), unsupported
    assert not any(item.startswith("code.decoder_layers") for item in unsupported), unsupported
    named = blockers(result.spec, ["unsupported"])
    assert any(b.term == "DSA lightning indexer (index top-k selection of keys)" for b in named)
    # the attention is latent attention, and the layers' routed experts are still read
    assert result.spec.attention.kind == "latent"
    assert result.spec.moe is not None


def test_a_dense_latent_attention_has_no_indexer(tmp_path):
    result = _research(tmp_path, "deepseek_v3")
    assert not any(item.startswith("sparse_indexer") for item in result.spec.unsupported or ())
