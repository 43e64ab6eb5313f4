"""transform.edit.unrotated on an explicit ``apply_rotary_pos_emb`` call (the
real vllm_neuron qwen3's forward_prefill rotates q and k outside its kernel):
the rotation is dropped, q and k flow unrotated; a call the edit cannot drop
is refused naming every such call of the file. Run through learned-positions
on an attention class alone (no backbone to edit)."""

from __future__ import annotations

import pytest

from autoport_cst.errors import PreconditionError
from autoport_cst.transform import PortContext
from autoport_cst.transform.base import run_on_source
from autoport_cst.transform.library import get_codemod

HELPERS = """
def _apply_rotary_emb(x, cos, sin):
    return x * cos + x * sin


def apply_rotary_pos_emb(q, k, cos, sin):
    return _apply_rotary_emb(q, cos, sin), _apply_rotary_emb(k, cos, sin)


class LlamaAttention(nn.Module):
"""


def _unrotated(methods: str) -> str:
    cls = get_codemod("learned-positions")
    return run_on_source(cls(cls.parse_params({})), HELPERS + methods, "model.py", "model", PortContext())[0]


def test_the_rotation_of_q_and_k_in_place_is_dropped_and_the_helpers_with_it():
    out = _unrotated(
        "    def forward_prefill(self, hidden_states, position_embeddings):\n"
        "        q, k, v = self.qkv(hidden_states)\n"
        "        cos, sin = position_embeddings\n"
        "        q, k = apply_rotary_pos_emb(q, k, cos, sin)\n"
        "        return NF.flash_attention(q, k, v)\n"
    )
    body = out[out.index("def forward_prefill") :].splitlines()[1:]
    assert [line.strip() for line in body if line.strip()] == [
        "q, k, v = self.qkv(hidden_states)",
        "return NF.flash_attention(q, k, v)",
    ]
    assert "def apply_rotary_pos_emb" not in out and "def _apply_rotary_emb" not in out


def test_rotated_tensors_under_other_names_are_bound_to_the_unrotated_ones():
    out = _unrotated(
        "    def forward_prefill(self, hidden_states, position_embeddings):\n"
        "        q, k, v = self.qkv(hidden_states)\n"
        "        cos, sin = position_embeddings\n"
        "        q_rot, k_rot = apply_rotary_pos_emb(q, k, cos, sin)\n"
        "        x = _apply_rotary_emb(v, cos, sin)\n"
        "        return NF.flash_attention(q_rot, k_rot, x)\n"
    )
    assert "q_rot, k_rot = q, k  # <-- MODEL-SPECIFIC: no rotation" in out
    assert "x = v  # <-- MODEL-SPECIFIC: no rotation" in out
    assert "cos" not in out[out.index("def forward_prefill") :]


def test_calls_the_edit_cannot_drop_are_refused_each_named():
    with pytest.raises(PreconditionError) as refused:
        _unrotated(
            "    def forward_prefill(self, hidden_states, position_embeddings):\n"
            "        q, k, v = self.qkv(hidden_states)\n"
            "        cos, sin = position_embeddings\n"
            "        q = apply_rotary_pos_emb(q, k, cos, sin)[0]\n"
            "        return NF.flash_attention(q, k, v)\n"
            "\n"
            "    def forward_decode(self, hidden_states, position_embeddings):\n"
            "        q, k, v = self.qkv(hidden_states)\n"
            "        cos, sin = position_embeddings\n"
            "        q, k = apply_rotary_pos_emb(q * 2, k, cos, sin)\n"
            "        return NF.flash_attention(q, k, v)\n"
        )
    message = str(refused.value)
    assert "2 such call(s)" in message
    assert "forward_prefill (line 14): `q = apply_rotary_pos_emb(q, k, cos, sin)[0]`" in message
    assert "forward_decode (line 20): `q, k = apply_rotary_pos_emb(q * 2, k, cos, sin)`" in message
