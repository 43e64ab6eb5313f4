"""OPT: a feed-forward the decoder layer computes itself (``fc2(relu(fc1(x)))``
between its own LayerNorm and residual add, no MLP module), learned positions
with two rows before position 0, queries scaled after their projection (the
kernel's ``scaling=1.0``), LayerNorms with the code's epsilon. Research reads
the layer's own projections as the MLP (by what they compute), and the port
from the reference with the smallest realizable diff validates; token
embeddings of another width (``word_embed_proj_dim`` != ``hidden_size``:
``project_in`` / ``project_out``, OPT-350m) are refused by that name."""

from __future__ import annotations

import json

import pytest

from autoport_cst.errors import UnrealizableDiffError
from autoport_cst.port import port
from autoport_cst.research import research
from autoport_cst.validate import build_tiny_checkpoint


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("opt")


@pytest.fixture(scope="module")
def opt(workdir):
    """The transformers default config made tiny: embeddings as wide as the
    layers (no project_in / project_out), as in OPT-125m."""
    source = workdir / "opt"
    build_tiny_checkpoint("OPTForCausalLM", source, seed=0)
    return source


def test_research_reads_the_layer_s_own_feed_forward(opt):
    """fc1 and fc2 are the MLP's up and down projections (plain, ReLU,
    biased, ffn_dim wide); the queries' scale after q_proj is the default
    scale; the table keeps 2 rows before position 0."""
    found = research(str(opt))
    spec = found.spec
    assert not spec.unsupported, spec.unsupported
    assert (spec.mlp.kind, spec.mlp.activation, spec.mlp.bias) == ("plain", "relu", True)
    config = json.loads((opt / "config.json").read_text())
    assert spec.mlp.intermediate_size == config["ffn_dim"]
    assert spec.checkpoint.key_map["mlp.up_proj"] == "fc1"
    assert spec.checkpoint.key_map["mlp.down_proj"] == "fc2"
    assert spec.checkpoint.key_map["post_attention_layernorm"] == "final_layer_norm"
    assert spec.checkpoint.config_keys == {"intermediate_size": "ffn_dim"}
    assert spec.attention.scale is None and "attention.scale_key" not in found.unknown
    assert (spec.norm.placement, spec.residual.parallel) == ("pre", "none")
    assert (spec.embedding.learned_positions, spec.embedding.positions_offset) == (True, 2)


def test_embeddings_of_another_width_are_refused_by_name(workdir, opt):
    """Embeddings narrower than the layers (OPT-350m: 512 and 1024) are
    projected in and out: refused, named, nothing written."""
    source = workdir / "opt_projected"
    source.mkdir()
    config = json.loads((opt / "config.json").read_text())
    config["word_embed_proj_dim"] = config["hidden_size"] // 2
    (source / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnrealizableDiffError) as refused:
        port(str(source), "opt_projected", workdir / "out_projected")
    assert set(refused.value.features) == {"embedding_projection"}
    assert "project_in" in str(refused.value) and "project_out" in str(refused.value)
    assert not (workdir / "out_projected" / "vllm_neuron").exists()


@pytest.mark.slow
def test_opt_ports_and_validates(workdir, opt):
    """On the checkpoint's own weights: TP=1 fp32 (with the config variants
    and parallel layouts) and bf16, and TP=2."""
    outcome = port(str(opt), "opt", workdir / "ports", tp=2, force=True, checkpoint="source", steps=8)
    assert outcome.validated, [(r.tp, r.dtype, r.first_diverging) for r in outcome.runs]
    assert [(r.tp, r.dtype) for r in outcome.runs] == [(1, "fp32"), (1, "bf16"), (2, "fp32")]
    assert outcome.reference == "starcoder2"
    assert {"learned-positions", "mlp-activation", "checkpoint-keys"} <= set(outcome.steps)
