"""XGLM, read by what its code computes: its attention written out
(``torch.bmm`` of the queries, scaled by head_dim ** -0.5 before the
product, and the keys; the causal mask added and clamped to the dtype's
minimum; a softmax; ``torch.bmm`` with the values) is softmax attention
with the kernel's default scale, no window, sinks or softcap, its q/k/v
projections named by the products' operands (not by the order
``__init__`` builds them: k, v, q); its positions a fixed sinusoidal table
whose base, offset and padding row research reads from the code; its
token embeddings scaled by sqrt(d_model) inside the embedding module. A
table computed otherwise is named with what was not read."""

from __future__ import annotations

import ast
import textwrap

import pytest

from autoport_cst.research.analysis import sinusoidal

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def xglm(tmp_path_factory):
    from autoport_cst.research import research
    from autoport_cst.validate import build_tiny_checkpoint

    source = tmp_path_factory.mktemp("xglm") / "xglm"
    build_tiny_checkpoint("XGLMForCausalLM", source, seed=0)
    return research(str(source))


def test_written_out_attention_is_the_kernel_s(xglm):
    attention = xglm.spec.attention
    assert (attention.kind, attention.scale, attention.sliding_window) == ("softmax", None, "none")
    assert (attention.sinks, attention.softcap) == (False, None)
    assert (attention.qkv_bias, attention.o_bias) == (True, True)
    assert xglm.spec.unsupported is None, xglm.spec.unsupported
    assert "scores scaled by head_dim ** -0.5" in xglm.decision("attention.scale").evidence


def test_q_k_v_named_by_the_products_operands(xglm):
    """Built k, v, q: named by declaration order they were mapped to each
    other's checkpoint keys (q_proj=k_proj, ...); each now loads its own."""
    key_map = dict(xglm.spec.checkpoint.key_map or {})
    assert key_map.get("self_attn.o_proj") == "self_attn.out_proj"
    assert not {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"} & set(key_map), key_map


def test_sinusoidal_positions_read_from_the_code(xglm):
    embedding = xglm.spec.embedding
    assert embedding.sinusoidal_positions and not embedding.learned_positions
    assert (embedding.positions_base, embedding.positions_offset) == (10000.0, 2)
    assert embedding.positions_padding_key == "pad_token_id"
    assert embedding.scale == "sqrt_hidden"
    evidence = xglm.decision("embedding.sinusoidal_positions").evidence
    assert "XGLMSinusoidalPositionalEmbedding.get_embedding" in evidence and "row position + 2" in evidence


TABLE = """
def get_embedding(num_embeddings, embedding_dim, padding_idx=None):
    half_dim = embedding_dim // 2
    emb = math.log(10000) / (half_dim - 1)
    emb = torch.exp(torch.arange(half_dim, dtype=torch.int64).float() * -emb)
    emb = torch.arange(num_embeddings, dtype=torch.int64).float().unsqueeze(1) * emb.unsqueeze(0)
    emb = torch.cat([torch.sin(emb), torch.cos(emb)], dim=1).view(num_embeddings, -1)
    return emb
"""


def _function(code: str) -> ast.FunctionDef:
    node = ast.parse(textwrap.dedent(code)).body[0]
    assert isinstance(node, ast.FunctionDef)
    return node


def test_the_base_and_the_layout_of_the_table():
    table = _function(TABLE)
    assert sinusoidal._base(table) == 10000.0
    assert sinusoidal._sines_then_cosines(table)


@pytest.mark.parametrize(
    "change",
    [
        ("/ (half_dim - 1)", "/ half_dim"),  # fairseq's other denominator
        ("* -emb", "* emb"),  # rising frequencies
        ("math.log(10000)", "math.log(base)"),  # a base not written in the code
    ],
)
def test_other_frequencies_are_not_read(change):
    assert sinusoidal._base(_function(TABLE.replace(*change))) is None


def test_cosines_first_or_interleaved_are_not_read():
    swapped = TABLE.replace("[torch.sin(emb), torch.cos(emb)]", "[torch.cos(emb), torch.sin(emb)]")
    stacked = TABLE.replace("], dim=1)", "], dim=0)")
    assert not sinusoidal._sines_then_cosines(_function(swapped))
    assert not sinusoidal._sines_then_cosines(_function(stacked))
