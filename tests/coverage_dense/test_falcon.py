"""Falcon: attention written out (the scores ``q @ k^T / sqrt(head_dim)``, the
causal mask transformers builds, a softmax) behind an ``alibi`` argument the
backbone withholds when the config has no ALiBi; a fused multi-query
``query_key_value``, parallel attention and MLP from one LayerNorm, a GELU
MLP. Research reads the attention by what the rotary path computes, the
ALiBi configs are refused by that name, and the port from the reference
with the smallest realizable diff validates."""

from __future__ import annotations

import json
import shutil

import pytest

from autoport_cst.errors import UnrealizableDiffError
from autoport_cst.port import port
from autoport_cst.research import research
from autoport_cst.validate import build_tiny_checkpoint


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("falcon")


@pytest.fixture(scope="module")
def falcon(workdir):
    source = workdir / "falcon"
    build_tiny_checkpoint("FalconForCausalLM", source, seed=0)
    return source


def _variant(workdir, source, name: str, **changes) -> str:
    """A config-only copy of ``source`` with ``changes`` (research reads no
    tensor data)."""
    target = workdir / name
    target.mkdir(exist_ok=True)
    config = json.loads((source / "config.json").read_text())
    # transformers 5.25's FalconConfig derives num_key_value_heads from num_kv_heads and
    # multi_query (and keeps a value config.json gives): dropped, it is derived for the copy
    config.pop("num_key_value_heads", None)
    config.update(changes)
    (target / "config.json").write_text(json.dumps(config))
    return str(target)


def test_research_reads_the_written_out_attention(falcon):
    """The rotary path's scores scaled by head_dim ** -0.5 under a plain
    causal mask (written out up to transformers 5.24, an attention kernel
    call since 5.25): no scale, window, sinks or softcap left unclassified,
    no "explicit_attention" refusal, one KV head from the fused projection,
    its rows [q | k | v] (read by running the split on the rows)."""
    found = research(str(falcon))
    spec = found.spec
    assert spec.unsupported is None or not any("explicit_attention" in u for u in spec.unsupported)
    for field in ("attention.scale", "attention.sliding_window", "attention.sinks", "attention.softcap"):
        assert field not in found.unknown, field
    assert (spec.attention.scale, spec.attention.sliding_window) == (None, "none")
    assert spec.attention.num_kv_heads == 1 and spec.attention.multi_query_key == "multi_query"
    assert spec.checkpoint.qkv == "fused" and spec.residual.parallel == "shared_norm"
    assert (spec.mlp.kind, spec.mlp.activation) == ("plain", "gelu")


@pytest.fixture(scope="module")
def alibi_adds(workdir, falcon):
    """How many times the installed transformers adds Falcon-RW's bias in
    eager attention, measured: 2 when the eager logits are SDPA's with the
    bias doubled (SDPA adds the mask alone, eager the mask and alibi again:
    transformers up to 5.24), 1 when eager and SDPA agree (the bias only in
    the mask, one attention function for both: 5.25)."""
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM
    from transformers.models.falcon import modeling_falcon

    source = workdir / "falcon_alibi_weights"
    shutil.copytree(falcon, source, dirs_exist_ok=True)
    config = json.loads((source / "config.json").read_text())
    (source / "config.json").write_text(json.dumps({**config, "alibi": True}))
    ids = torch.randint(0, config["vocab_size"], (1, 12), generator=torch.Generator().manual_seed(0))
    built = modeling_falcon.build_alibi_tensor

    def logits(implementation: str, factor: float):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(modeling_falcon, "build_alibi_tensor", lambda *a, **k: factor * built(*a, **k))
            model = AutoModelForCausalLM.from_pretrained(
                source, attn_implementation=implementation, dtype=torch.float32
            )
            with torch.no_grad():
                return model.eval()(ids).logits

    eager, sdpa, sdpa_doubled = logits("eager", 1.0), logits("sdpa", 1.0), logits("sdpa", 2.0)
    assert (sdpa - sdpa_doubled).abs().max() > 1e-3  # the bias changes the logits
    if torch.allclose(eager, sdpa_doubled, rtol=1e-5, atol=1e-5):
        return 2
    torch.testing.assert_close(eager, sdpa, rtol=1e-5, atol=1e-5)  # neither: a third behaviour
    return 1


def test_alibi_configs_are_refused_by_name(workdir, falcon, alibi_adds):
    """With ``alibi`` the backbone builds a per-head bias and folds it into
    the attention mask: the refusal names that (alibi_in_mask), with what the
    installed transformers' attention does with it, as measured: adds it
    twice in eager (the mask and alibi again), or once, inside the mask it
    gives its attention function."""
    source = _variant(workdir, falcon, "falcon_alibi", alibi=True)
    with pytest.raises(UnrealizableDiffError) as refused:
        port(source, "falcon_alibi", workdir / "out_alibi")
    assert set(refused.value.features) == {"alibi_in_mask"}
    said = {2: "adds to its scores twice", 1: "adds it to its scores once, inside the mask"}
    assert said[alibi_adds] in str(refused.value), str(refused.value)
    assert said[3 - alibi_adds] not in str(refused.value)
    assert not (workdir / "out_alibi" / "vllm_neuron").exists()


def test_transformers_adds_the_alibi_bias_twice_in_eager_and_once_in_sdpa(alibi_adds):
    """Why alibi_in_mask reads as it does, measured on the installed
    transformers (``alibi_adds``): up to 5.24 the eager attention's logits
    are SDPA's with the bias doubled, so the two implementations of one
    checkpoint disagree; since 5.25 both add it once. Either is a fact the
    fixture asserts; a third behaviour fails it."""
    assert alibi_adds in (1, 2)


def test_the_rotary_port_guards_alibi(falcon):
    """The port of the rotary Falcon computes no ALiBi: config-guards refuses
    a config with alibi=True (the fields it fixes: the RoPE and the scores)."""
    from autoport_cst.plan.plan_file import assumptions_of

    guards = assumptions_of(research(str(falcon)), "llama3").step()
    assumed = {entry["field"]: entry for entry in guards["params"]["assumed"]}
    assert assumed["alibi"]["value"] is False
    assert "rope.type" in assumed["alibi"]["fixes"]


@pytest.mark.slow
def test_falcon_ports_and_validates(workdir, falcon):
    """On the checkpoint's own weights: TP=1 fp32 (with the config variants
    and parallel layouts) and bf16, and TP=2."""
    outcome = port(str(falcon), "falcon", workdir / "ports", tp=2, force=True, checkpoint="source", steps=8)
    assert outcome.validated, [(r.tp, r.dtype, r.first_diverging) for r in outcome.runs]
    assert [(r.tp, r.dtype) for r in outcome.runs] == [(1, "fp32"), (1, "bf16"), (2, "fp32")]
    assert {"multi-query", "parallel-residual", "fused-checkpoint"} <= set(outcome.steps)


@pytest.mark.parametrize(("norms", "parallel"), [(2, "separate_norms"), (1, "shared_norm")])
def test_kv_head_groups_are_read_from_the_rows(workdir, falcon, norms, parallel):
    """The new decoder architecture (Falcon-40B/180B) stores its fused
    projection as groups per KV head, each its query heads, a key and a
    value head: research reads that from the rows each head reads (its split
    run on the row numbers), as fused_kv_groups, and the KV head count from
    num_kv_heads (config.json of transformers 5.24 has no
    num_key_value_heads; 5.25 writes it). With num_ln_in_parallel_attn = 2
    attention and MLP each read their own LayerNorm (ln_attn, ln_mlp), with
    1 both read input_layernorm. Ported and validated in
    tests/coverage_dense/test_falcon_layouts.py."""
    source = _variant(
        workdir,
        falcon,
        f"falcon_groups_{norms}",
        new_decoder_architecture=True,
        num_kv_heads=2,
        num_ln_in_parallel_attn=norms,
    )
    found = research(source)
    spec = found.spec
    assert not spec.unsupported and not found.unknown
    assert (spec.checkpoint.qkv, spec.attention.num_kv_heads, spec.residual.parallel) == (
        "fused_kv_groups",
        2,
        parallel,
    )
    keys = spec.checkpoint.config_keys or {}
    config = json.loads((workdir / f"falcon_groups_{norms}" / "config.json").read_text())
    assert keys.get("num_key_value_heads") == (None if "num_key_value_heads" in config else "num_kv_heads")
    named = {k: v for k, v in (spec.checkpoint.key_map or {}).items() if "layernorm" in k}
    assert named == (
        {"input_layernorm": "ln_attn", "post_attention_layernorm": "ln_mlp"} if norms == 2 else {}
    )
