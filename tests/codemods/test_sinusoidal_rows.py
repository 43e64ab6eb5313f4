"""sinusoidal-positions computes in forward the rows transformers' XGLM
holds in its table: the same float32 values bit for bit, for even and odd
widths, with and without a padding row, for rows in any order."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
modeling_xglm = pytest.importorskip("transformers.models.xglm.modeling_xglm")


def _rows_function():
    from autoport_cst.codemods.sinusoidal_positions import ROWS

    namespace: dict = {"math": math, "torch": torch}
    exec(ROWS, namespace)
    return namespace["_sinusoidal_rows"]


@pytest.mark.parametrize(("width", "padding_idx"), [(64, 1), (64, None), (15, 4), (8, 0)])
def test_the_rows_of_transformers_table(width, padding_idx):
    rows_of = _rows_function()
    table = modeling_xglm.XGLMSinusoidalPositionalEmbedding.get_embedding(40, width, padding_idx)
    rows = torch.tensor([5, 0, 39, 4, 1, 2, 17])
    computed = rows_of(rows, width, 10000.0, padding_idx)
    assert computed.dtype == torch.float32 and computed.shape == (len(rows), width)
    assert torch.equal(computed, table[rows])


def test_another_base_gives_other_rows():
    rows_of = _rows_function()
    table = modeling_xglm.XGLMSinusoidalPositionalEmbedding.get_embedding(10, 16, None)
    assert not torch.allclose(rows_of(torch.arange(10), 16, 1000.0, None), table)
