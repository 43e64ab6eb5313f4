"""Dense multi-latent attention models (no routed experts) from the deepseek_v3
reference: the no-experts codemod leaves every layer with the dense MLP and
removes the mixture of experts and what only it used; rotate-half-rope fixes
the rotary pairing to the halves (MiniCPM3's apply_rotary_pos_emb). Youtu
(MLA, interleaved RoPE, dense MLPs) ports and validates end to end. MiniCPM3
is refused by name: its residual multiplier is scale_depth /
sqrt(num_hidden_layers), computed from two config fields, which no port reads
(the residual-multiplier codemod reads one field)."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from click.testing import CliRunner  # noqa: E402

from autoport_cst.cli import cli  # noqa: E402
from autoport_cst.transform.base import PortContext, run_on_source  # noqa: E402
from autoport_cst.transform.library import get_codemod  # noqa: E402

MODEL = Path(__file__).resolve().parents[2] / "reference_models" / "deepseek_v3" / "model.py"


def _run(codemod_id: str, source: str) -> str:
    cls = get_codemod(codemod_id)
    out = run_on_source(cls(cls.parse_params({})), source, "model.py", "model", PortContext())[0]
    again = run_on_source(cls(cls.parse_params({})), out, "model.py", "model", PortContext())[0]
    assert again == out, f"{codemod_id} is not idempotent"
    compile(out, "model.py", "exec")
    return out


def _defined(source: str) -> set[str]:
    tree = ast.parse(source)
    names = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
        names |= {f"{cls.name}.{m.name}" for m in cls.body if isinstance(m, ast.FunctionDef)}
    return names


def test_no_experts_leaves_the_dense_mlp_on_every_layer_and_removes_what_only_the_experts_used():
    source = MODEL.read_text()
    out = _run("no-experts", source)
    before, after = _defined(source), _defined(out)
    gone = before - after
    assert {"DeepseekV3MoE", "group_limited_topk", "DeepseekV3ForCausalLM._moe_keys"} <= gone
    assert {"moe_checkpoint_keys", "MoECheckpointKeys", "expert_gate_up_loader"} <= gone
    # what the rest of the model uses stays
    assert {"DeepseekV3DenseMLP", "DeepseekV3GatedMLP", "DeepseekV3Attention", "apply_rope"} <= after
    layer = next(
        n for n in ast.parse(out).body if isinstance(n, ast.ClassDef) and n.name == "DeepseekV3DecoderLayer"
    )
    init = next(n for n in layer.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    assert "self.mlp = DeepseekV3DenseMLP(config)" in ast.unparse(init)
    assert "first_k_dense_replace" not in ast.unparse(init) and "dense =" not in ast.unparse(init)
    assert "DeepseekV3MoE" not in out


def _apply_rope(source: str):
    tree = ast.parse(source)
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "apply_rope")
    namespace: dict = {"torch": torch}
    exec(compile(ast.Module(body=[node], type_ignores=[]), "model.py", "exec"), namespace)
    return namespace["apply_rope"]


@pytest.mark.parametrize("seed", range(3))
def test_rotate_half_rope_rotates_as_minicpm3(seed):
    from transformers.models.minicpm3 import modeling_minicpm3

    out = _run("rotate-half-rope", MODEL.read_text())
    assert "self.rope_interleave = False" in out and "config.rope_interleave" not in out
    apply_rope = _apply_rope(out)
    generator = torch.Generator().manual_seed(seed)
    q, k = torch.randn(1, 3, 5, 8, generator=generator), torch.randn(1, 1, 5, 8, generator=generator)
    angles = torch.rand(5, 4, generator=generator) * 6.0
    cos, sin = torch.cat((angles, angles), -1).cos(), torch.cat((angles, angles), -1).sin()
    expected_q, expected_k = modeling_minicpm3.apply_rotary_pos_emb(q, k, cos[None], sin[None])
    # the reference's apply_rope: x [..., T, d], cos/sin [T, d]
    torch.testing.assert_close(apply_rope(q[0], cos, sin, False), expected_q[0])
    torch.testing.assert_close(apply_rope(k[0], cos, sin, False), expected_k[0])
    # the interleaved pairing (what the reference did for a config without rope_interleave) differs
    assert not torch.allclose(_apply_rope(MODEL.read_text())(q[0], cos, sin, True), expected_q[0])


def _port(tmp_path: Path, architecture: str) -> tuple[int, dict, str]:
    from autoport_cst.validate import build_tiny_checkpoint

    source = tmp_path / "source"
    build_tiny_checkpoint(architecture, source, seed=0)
    outcome = tmp_path / "outcome.json"
    result = CliRunner().invoke(
        cli, ["port", str(source), "--out", str(tmp_path / "out"), "--tp", "2", "--json", str(outcome)]
    )
    data = json.loads(outcome.read_text()) if outcome.is_file() else {}
    return result.exit_code, data, result.output


@pytest.mark.slow
def test_youtu_ports_and_validates(tmp_path):
    code, data, output = _port(tmp_path, "YoutuForCausalLM")
    assert code == 0, output
    assert data.get("reference") == "deepseek_v3", data
    assert "no-experts" in set(data.get("steps") or ()), data


def test_minicpm3_is_refused_for_its_derived_residual_multiplier(tmp_path):
    code, _, output = _port(tmp_path, "MiniCPM3ForCausalLM")
    assert code == 2, output
    assert "[derived_multiplier]" in output and "scale_depth" in output, output
    assert not (tmp_path / "out" / "vllm_neuron").exists()
