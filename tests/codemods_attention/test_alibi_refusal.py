"""A model with ALiBi whose reference the alibi-positions codemod cannot edit
(here: a llama3 copy whose decode method takes no ``positions``) is refused,
nothing written, naming ALiBi in the user's terms and the codemod's
precondition with its place in the reference."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from autoport_cst.errors import UnrealizableDiffError
from autoport_cst.port import port
from tests.research.tiny_models import build

REFERENCE = Path(__file__).resolve().parents[2] / "reference_models" / "llama3"


def test_a_reference_the_codemod_cannot_edit_refuses_naming_alibi(tmp_path):
    pytest.importorskip("transformers")
    reference = tmp_path / "llama3_no_positions"
    shutil.copytree(REFERENCE, reference)
    model = reference / "model.py"
    source = model.read_text()
    signature = "    def forward_decode(\n        self,\n        hidden_states: torch.Tensor,\n        positions: torch.Tensor,"
    assert source.count(signature) == 1
    source = source.replace(signature, signature.replace("positions:", "step_positions:"))
    source = source.replace(
        "        pos_ids = positions.view(",
        "        positions = step_positions\n        pos_ids = positions.view(",
    )
    model.write_text(source)
    checkpoint = build("mpt", tmp_path / "mpt")
    with pytest.raises(UnrealizableDiffError) as refused:
        port(str(checkpoint), "mpt", tmp_path / "out", ref=str(reference))
    message = str(refused.value)
    assert "ALiBi positions (a per-head bias on the attention scores, slopes 2 ** -(8 * i / n)" in message
    assert "alibi-positions: MptAttention.forward_decode takes no positions" in message
    assert "attention.alibi_bias_max" in refused.value.features
    assert not (tmp_path / "out" / "vllm_neuron").exists()
