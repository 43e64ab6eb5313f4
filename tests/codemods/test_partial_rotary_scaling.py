"""partial-rotary with a RoPE variant that scales cos and sin (YaRN): the
rotary embedding the codemods write, run on a query, rotates and scales the
first rotary_dim dimensions of each head as transformers does and leaves the
others as they are (no attention factor on the pass-through pairs).

The rotary class and the column order are taken from our references after
the codemods (qwen3_moe, which implements YaRN itself; llama3, taught YaRN by
rope-scaling first) and compared with transformers' YaRN
(``ROPE_INIT_FUNCTIONS``) applied as its ``apply_rotary_pos_emb`` applies it,
on a partial-rotary config."""

from __future__ import annotations
import __future__

import ast
import math
from pathlib import Path
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from autoport_cst.transform.base import PortContext, run_on_source  # noqa: E402
from autoport_cst.transform.library import get_codemod  # noqa: E402

REFERENCES = Path(__file__).resolve().parents[2] / "reference_models"
HEAD_DIM, FACTOR, THETA = 16, 0.5, 10000.0
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}


def _run(codemod_id: str, source: str, **params) -> str:
    cls = get_codemod(codemod_id)
    return run_on_source(cls(cls.parse_params(params)), source, "model.py", "model", PortContext())[0]


def _rotary_namespace(reference: str) -> dict:
    """The rotary class, ``_partial_rotary_factor`` and ``_rope_column_order``
    of the reference's model file after the codemods, executed."""
    source = (REFERENCES / reference / "model.py").read_text(encoding="utf-8")
    if reference == "llama3":
        source = _run("rope-scaling", source, variant="yarn")
    source = _run("partial-rotary", source)
    wanted = {"_partial_rotary_factor", "_rope_column_order"}
    tree = ast.parse(source)
    picked = [
        node
        for node in tree.body
        if (isinstance(node, ast.FunctionDef) and node.name in wanted)
        or (isinstance(node, ast.ClassDef) and node.name.endswith("RotaryEmbedding"))
    ]
    assert len(picked) == 3, [getattr(n, "name", "") for n in picked]
    namespace: dict = {"torch": torch, "nn": torch.nn, "math": math}
    # annotations (the config class) left unevaluated
    code = compile(
        ast.Module(body=picked, type_ignores=[]),
        "model.py",
        "exec",
        flags=__future__.annotations.compiler_flag,
    )
    exec(code, namespace)  # noqa: S102
    return namespace


def _reference_config(reference: str) -> SimpleNamespace:
    rope = {**YARN, "rope_theta": THETA, "partial_rotary_factor": FACTOR}
    return SimpleNamespace(
        head_dim=HEAD_DIM,
        rope_theta=THETA,
        rope_scaling=rope,
        rope_parameters=rope,
        partial_rotary_factor=None,
        max_position_embeddings=256,
        original_max_position_embeddings=None,
    )


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _transformers_rotation(query: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """transformers' YaRN frequencies and attention factor for a partial-rotary
    config (GLM-4-MoE's), applied as its ``apply_rotary_pos_emb`` applies them:
    the first rotary_dim dimensions rotated (cos and sin times the factor),
    the others concatenated unchanged."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = transformers.Glm4MoeConfig(
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=4,
        head_dim=HEAD_DIM,
        max_position_embeddings=256,
        rope_parameters={**YARN, "rope_theta": THETA, "partial_rotary_factor": FACTOR},
    )
    inv_freq, attention_factor = ROPE_INIT_FUNCTIONS["yarn"](config)
    freqs = torch.outer(positions.float(), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos() * attention_factor, emb.sin() * attention_factor
    width = cos.shape[-1]
    rotated, passed = query[..., :width], query[..., width:]
    return torch.cat((rotated * cos + _rotate_half(rotated) * sin, passed), dim=-1)


@pytest.mark.parametrize("reference", ["qwen3_moe", "llama3"])
def test_yarn_scales_only_the_rotated_dimensions(reference):
    namespace = _rotary_namespace(reference)
    rotary_cls = next(v for k, v in namespace.items() if k.endswith("RotaryEmbedding"))
    rotary = rotary_cls(_reference_config(reference))
    assert rotary.attention_scaling > 1.0  # YaRN's factor: what the pass-through pairs must not take
    positions = torch.arange(12)
    query = torch.randn(1, 1, 12, HEAD_DIM, generator=torch.Generator().manual_seed(0))
    expected = _transformers_rotation(query, positions)
    order = namespace["_rope_column_order"](HEAD_DIM, int(HEAD_DIM * FACTOR), False)
    cos, sin = rotary(positions, torch.device("cpu"), torch.float32)
    ported = query[..., order]
    got = ported * cos + _rotate_half(ported) * sin
    torch.testing.assert_close(got, expected[..., order], rtol=1e-5, atol=1e-5)
