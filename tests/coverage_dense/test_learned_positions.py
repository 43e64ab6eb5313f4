"""The GPT-2 lineage: learned absolute positions instead of RoPE
(``learned-positions``), GPT-2's fused Conv1D ``c_attn`` and gpt_bigcode's
multi-query fused ``c_attn`` (``multi-query``). Research names the position
table (its config field and offset, its checkpoint key), the codemod removes
every rotation site of a reference or refuses, and the ports validate."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from autoport_cst.port import port
from autoport_cst.research import research
from autoport_cst.transform.base import run_on_source
from autoport_cst.transform.library import get_codemod
from autoport_cst.validate import build_tiny_checkpoint

REFERENCES = Path(__file__).resolve().parents[2] / "reference_models"
LearnedPositions = get_codemod("learned-positions")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("learned_positions")


def _ported(reference: str, size_key: str = "n_positions", offset: int = 0) -> str:
    source = (REFERENCES / reference / "model.py").read_text()
    params = LearnedPositions.Params(size_key=size_key, offset=offset)
    return run_on_source(LearnedPositions(params), source)[0]


@pytest.mark.parametrize("reference", ["starcoder2", "llama3"])
def test_every_rotation_site_of_a_reference_goes(reference):
    """No RoPE left on any path: no rotary module, no (cos, sin) read, the
    kernels get None; the table is looked up with the runner's positions."""
    code = _ported(reference)
    tree = ast.parse(code)
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    assert not {"cos", "sin"} & names
    assert "RotaryEmbedding" not in code and "apply_rotary_pos_emb" not in code
    assert "self.rotary_emb" not in code
    assert code.count("position_embeddings = None") == 1
    for kernel_arg in ("cos_cache=cos_cache", "sin_cache=sin_cache", "cos=cos_kernel", "sin=sin_kernel"):
        assert kernel_arg in code, kernel_arg
    assert "cos_cache = None" in code and "cos_kernel = None" in code
    assert "config.n_positions + self.position_offset" in code
    assert 'mappings["model.embed_positions.weight"] = "model.embed_positions.weight"' in code
    assert _ported(reference) == code  # deterministic
    assert run_on_source(LearnedPositions(LearnedPositions.Params(size_key="n_positions")), code)[0] == code


def test_an_offset_table_reads_its_rows_past_the_offset():
    """OPT's table keeps 2 rows before position 0: max_position_embeddings + 2
    rows, position p at row p + 2."""
    code = _ported("starcoder2", size_key="max_position_embeddings", offset=2)
    assert "self.position_offset = 2" in code
    assert "config.max_position_embeddings + self.position_offset" in code
    assert "positions.to(torch.long) + self.position_offset" in code


def test_a_reference_rotating_outside_the_kernels_loses_that_rotation():
    """qwen3 rotates q and k in Python on its prefill path (``q, k =
    apply_rotary_pos_emb(q, k, cos, sin)``): that statement goes, q and k
    unrotated (transform.edit.unrotated; it was refused), and the helpers with it."""
    code = _ported("qwen3")
    assert "q, k = apply_rotary_pos_emb(" in (REFERENCES / "qwen3" / "model.py").read_text()
    assert "apply_rotary_pos_emb(q" not in code and "def apply_rotary_pos_emb" not in code
    assert "def _apply_rotary_emb" not in code and "cos, sin = position_embeddings" not in code
    assert "cos_kernel = None" in code


def test_research_names_the_position_table(workdir):
    """GPT-2's table is n_positions rows (config field, no offset) stored as
    transformer.wpe; OPT's keeps two rows before position 0."""
    gpt2 = workdir / "gpt2"
    build_tiny_checkpoint("GPT2LMHeadModel", gpt2, seed=0)
    spec = research(str(gpt2)).spec
    assert spec.embedding.learned_positions is True
    assert (spec.embedding.positions_key, spec.embedding.positions_offset) == ("n_positions", 0)
    assert spec.checkpoint.key_map["model.embed_positions"] == "transformer.wpe"
    assert spec.checkpoint.linear_layout == "in_out" and spec.checkpoint.qkv == "fused"
    opt = workdir / "opt"
    build_tiny_checkpoint("OPTForCausalLM", opt, seed=0)
    spec = research(str(opt)).spec
    assert (spec.embedding.positions_key, spec.embedding.positions_offset) == ("max_position_embeddings", 2)


def test_gpt_bigcode_is_multi_query(workdir):
    """gpt_bigcode's c_attn holds one key and one value head: research reads
    the multi_query flag instead of refusing the head count."""
    source = workdir / "gpt_bigcode"
    build_tiny_checkpoint("GPTBigCodeForCausalLM", source, seed=0)
    spec = research(str(source)).spec
    assert spec.attention.multi_query_key == "multi_query"
    assert spec.attention.num_kv_heads == 1
    assert not any("num_kv_heads" in entry for entry in spec.unsupported or ())


@pytest.mark.slow
@pytest.mark.parametrize("architecture", ["GPT2LMHeadModel", "GPTBigCodeForCausalLM"])
def test_the_gpt2_lineage_ports_and_validates(architecture, workdir):
    """From starcoder2, on the checkpoint's own weights: TP=1 fp32 (with the
    config variants and parallel layouts) and bf16, and TP=2."""
    source = workdir / f"{architecture}_source"
    build_tiny_checkpoint(architecture, source, seed=0)
    name = architecture.lower().removesuffix("forcausallm").removesuffix("lmheadmodel")
    outcome = port(str(source), name, workdir / "ports", tp=2, force=True, checkpoint="source", steps=8)
    assert outcome.validated, [(r.tp, r.dtype, r.first_diverging) for r in outcome.runs]
    assert [(r.tp, r.dtype) for r in outcome.runs] == [(1, "fp32"), (1, "bf16"), (2, "fp32")]
    assert outcome.reference == "starcoder2"
    assert "learned-positions" in outcome.steps
