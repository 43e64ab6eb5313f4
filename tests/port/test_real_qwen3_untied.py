"""Ports of untied models (``tie_word_embeddings`` false) from the real
vllm_neuron qwen3 (third-party: never shipped; README, "The real vllm_neuron
packages"), run only where a local rebuild is present
(``AUTOPORT_REAL_VLLM_NEURON``, as tests/port/test_real_vllm_neuron.py).

The real qwen3's forward_prefill rotates q and k outside its kernel
(``q, k = apply_rotary_pos_emb(q, k, cos, sin)``): alibi-positions and
learned-positions refused there; the rotation is now dropped
(transform.edit.unrotated). Its backbone has no embedding or MLP DP (no
``embedding_dp_size``, no ``_dp_transition``): learned-positions' lookup takes
the prefill SP slice alone. The real qwen3 breaks NRN009 itself (README);
its ports get the guard from apply's repair step (fp8-segmented-guard) and are
validated with the lint gate."""

from __future__ import annotations

import json
import os
from pathlib import Path

import libcst as cst
import pytest

from autoport_cst.transform import PortContext

REAL = Path(os.environ.get("AUTOPORT_REAL_VLLM_NEURON", "/work/real/vllm_neuron/model"))
pytestmark = pytest.mark.skipif(
    not (REAL / "qwen3" / "reference.json").is_file(),
    reason=f"no local rebuild of the real vllm_neuron qwen3 under {REAL} (AUTOPORT_REAL_VLLM_NEURON)",
)


def _method_code(source: str, cls_name: str, name: str) -> str:
    module = cst.parse_module(source)
    cls = next(n for n in module.body if isinstance(n, cst.ClassDef) and n.name.value == cls_name)
    method = next(s for s in cls.body.body if isinstance(s, cst.FunctionDef) and s.name.value == name)
    return module.code_for_node(method)


def test_learned_positions_drop_the_real_qwen3s_explicit_rotation():
    from autoport_cst.transform.base import run_on_source
    from autoport_cst.transform.library import get_codemod

    path = REAL / "qwen3" / "model.py"
    assert "q, k = apply_rotary_pos_emb(q, k, cos, sin)" in _method_code(
        path.read_text(), "Qwen3Attention", "forward_prefill"
    )
    cls = get_codemod("learned-positions")
    params = cls.parse_params({"size_key": "n_positions"})
    out = run_on_source(cls(params), path.read_text(), path.name, "model", PortContext())[0]
    prefill = _method_code(out, "Qwen3Attention", "forward_prefill")
    assert "apply_rotary_pos_emb" not in prefill and "cos, sin = position_embeddings" not in prefill
    lines = [
        line.strip() for line in prefill.splitlines() if line.strip() and not line.strip().startswith("#")
    ]
    at = lines.index("k = self.k_norm(k)")
    assert lines[at + 1].startswith("layer_name = ")  # q and k go on unrotated
    assert "def apply_rotary_pos_emb" not in out and "class Qwen3RotaryEmbedding" not in out
    lookup = _method_code(out, "Qwen3Model", "_position_embeddings")
    assert "if is_prefill and self.world_size > 1:" in lookup and "dp_group" not in lookup


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("real-qwen3-untied")


def _untied_checkpoint(model_type: str, workdir: Path) -> Path:
    """A tiny checkpoint of ``model_type`` (vocabulary 512) whose config unties the LM head."""
    from autoport_cst.validate import build_tiny_checkpoint

    tied = workdir / f"{model_type}-tied"
    build_tiny_checkpoint(model_type, tied, seed=0, dimensions={"vocab_size": 512})
    config = json.loads((tied / "config.json").read_text())
    config["tie_word_embeddings"] = False
    source = workdir / f"{model_type}_untied.json"
    source.write_text(json.dumps(config))
    checkpoint = workdir / model_type
    build_tiny_checkpoint(str(source), checkpoint, seed=0, dimensions={"vocab_size": 512})
    return checkpoint


@pytest.mark.slow
@pytest.mark.parametrize(
    "model_type, step",
    [("gpt2", "learned-positions"), ("mpt", "alibi-positions"), ("bloom", "alibi-positions")],
)
def test_untied_ports_from_the_real_qwen3_validate(model_type, step, workdir):
    from autoport_cst.apply import build_port, load_reference, write_port
    from autoport_cst.plan import from_research
    from autoport_cst.research import choose_reference, research
    from autoport_cst.validate import validate_model

    checkpoint = _untied_checkpoint(model_type, workdir)
    found = research(str(checkpoint))
    assert found.spec.embedding.tied is False
    choice = choose_reference(found.spec, "port", found.architecture, [str(REAL / "qwen3")], found)
    assert choice.realizable, choice.reason
    plan = from_research(found, "port", choice.chosen, "real-code test")
    result = build_port(plan, load_reference(str(REAL / "qwen3")))
    assert result.ok, str(result.failure)
    assert {step, "fp8-segmented-guard"} <= {s.codemod for s in result.steps}  # the NRN009 repair
    write_port(workdir / "ports" / model_type, result.files, result.package_dir, force=True)
    package = workdir / "ports" / model_type / result.package_dir
    for tp, dtype in ((1, "fp32"), (1, "bf16"), (2, "fp32")):
        report = validate_model(package, checkpoint, tp=tp, dtype=dtype, steps=8, parallel_layouts=False)
        assert report.equivalent, (tp, dtype, report.summary())
