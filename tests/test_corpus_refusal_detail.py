"""A corpus row names a spec field research could not classify as such, not
as one no codemod realizes: the rows of hrm_text, modernbert-decoder, hy_v4,
... said 'no codemod realizes embedding.scale' while codemods/embedding_scale.py
exists; their refusals say 'the embedding scale, which research could not
classify [embedding.scale]' (research/refusal.py)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from corpus_table import parse_row, refusal_detail  # noqa: E402

MESSAGE = (
    "not portable: no reference realizes modules with weights beside the text decoder [modules_beside_decoder] "
    "(...); the embedding scale, which research could not classify [embedding.scale] (...)"
)


def test_unclassified_fields_are_named_apart():
    features = ["modules_beside_decoder", "embedding.scale"]
    assert refusal_detail(features, MESSAGE) == (
        "no codemod realizes modules_beside_decoder; research could not classify embedding.scale"
    )
    assert refusal_detail(["embedding.scale"], MESSAGE, full_size=True) == (
        "research could not classify embedding.scale (full-size config)"
    )
    assert refusal_detail(["modules_beside_decoder"], MESSAGE) == "no codemod realizes modules_beside_decoder"


def test_rows_parse_back_with_every_feature_counted():
    detail = refusal_detail(["modules_beside_decoder", "embedding.scale"], MESSAGE, full_size=True)
    row = parse_row(f"| HrmTextForCausalLM | hrm_text | - | - | refused: {detail} | - | 1.0 |")
    assert row is not None and row["verdict"] == "refused"
    assert row["blocked"] == ["modules_beside_decoder", "embedding.scale"]
    only = parse_row("| X | x | - | - | refused: research could not classify norm.placement | - | 1.0 |")
    assert only is not None and only["blocked"] == ["norm.placement"]


def test_the_closest_reference_named_when_no_feature_blocks_every_reference():
    """minimax_m3_vl_text's clamped SwiGLU blocks qwen3_moe, the closest, and
    gpt_oss realizes it: the row said 'no codemod realizes mlp.glu'."""
    message = (
        "not portable: no one feature blocks every reference; the closest, qwen3_moe, does not realize "
        "gate and up combined as clamped_swiglu [mlp.glu] (...)"
    )
    detail = refusal_detail(["mlp.glu"], message)
    assert detail == "the closest reference, qwen3_moe, does not realize mlp.glu"
    row = parse_row(f"| MiniMaxM3VLForCausalLM | minimax_m3_vl_text | - | - | refused: {detail} | - | 2.9 |")
    assert row is not None and row["blocked"] == ["mlp.glu"]
