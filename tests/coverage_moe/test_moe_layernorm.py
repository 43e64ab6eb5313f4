"""LayerNorm on the MoE references (swap-norm): the experts' fused decode
kernel ``NF.moe_block_tkg`` normalizes its input with an RMSNorm (``gamma``,
``eps``), which a LayerNorm model does not compute: decode runs the unfused
path (the experts' norm module, the router and the blockwise kernel), by the
experts' ``fused_decode`` flag turned off; an experts class without the flag
is refused at the kernel call. Cohere2 MoE (tests/coverage_moe/
test_cohere2_moe_port.py) validates with it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from autoport_cst.errors import PreconditionError
from autoport_cst.transform.base import PortContext, run_on_source
from autoport_cst.transform.library import get_codemod

REFERENCE = Path(__file__).resolve().parents[2] / "reference_models" / "qwen3_moe" / "model.py"
FLAG = "        self.fused_decode = True\n"


def _reference() -> str:
    """qwen3_moe without its q/k norms (fused as RMSNorms in the attention's decode kernel, which
    swap-norm refuses: Cohere2 MoE has none)."""
    cls = get_codemod("remove-qk-norm")
    text = REFERENCE.read_text(encoding="utf-8")
    output, _ = run_on_source(cls(cls.parse_params({})), text, "model.py", "model", PortContext())
    return output


def _layernorm(text: str) -> str:
    cls = get_codemod("swap-norm")
    params = cls.parse_params({"kind": "layernorm", "bias": False, "eps_key": "layer_norm_eps"})
    output, _ = run_on_source(cls(params), text, "model.py", "model", PortContext())
    return output


def test_layernorm_turns_the_fused_moe_decode_kernel_off():
    text = _reference()
    assert text.count(FLAG) == 1
    output = _layernorm(text)
    assert "self.fused_decode = False" in output and FLAG not in output
    experts = output[output.index("class Qwen3MoeExperts(") : output.index("class Qwen3MoeMLP(")]
    # the unfused decode path normalizes with the experts' LayerNorm module
    assert "normalized = self.post_attention_layernorm(hidden_states)" in experts
    assert "class Qwen3MoeLayerNorm(" in output
    assert _layernorm(output) == output


def test_layernorm_is_refused_at_a_fused_moe_kernel_without_the_flag():
    text = _reference().replace(FLAG, "").replace("if self.fused_decode:", "if True:")
    with pytest.raises(PreconditionError) as refused:
        _layernorm(text)
    message = str(refused.value)
    assert "Qwen3MoeExperts._run_moe_block_tkg" in message and "fused_decode" in message, message
    assert re.search(r"model\.py:\d+:\d+", message), message
