"""Dense multi-latent attention models (no routed experts) from the deepseek_v3
reference: the no-experts codemod leaves every layer with the dense MLP and
removes the mixture of experts and what only it used; rotate-half-rope fixes
the rotary pairing to the halves (MiniCPM3's apply_rotary_pos_emb). Youtu
(MLA, interleaved RoPE, dense MLPs) ports and validates end to end, and so
does MiniCPM3, whose multipliers are computed from its config: the residual
multiplier scale_depth / sqrt(num_hidden_layers), the embedding module's
scale_emb, and the LM head's input divided by logits_scaling = hidden_size /
dim_model_base (a config property); the port computes each from config.json
at run time (config-key-aliases)."""

from __future__ import annotations

import ast
import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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


def _minicpm3_research(tmp_path: Path):
    from autoport_cst.research import research
    from autoport_cst.validate import build_tiny_checkpoint

    source = tmp_path / "minicpm3"
    build_tiny_checkpoint("MiniCPM3ForCausalLM", source, seed=0)
    return research(str(source))


MINICPM3_KEYS = {
    "residual_multiplier": "scale_depth / num_hidden_layers ** 0.5",
    "embedding_multiplier": "scale_emb",
    "logits_scaling": "hidden_size / dim_model_base",
}


def test_minicpm3_multipliers_are_read_as_arithmetic_of_its_config(tmp_path):
    """The residual multiplier scale_depth / sqrt(num_hidden_layers), the
    embedding module's scale_emb and the LM head's input divided by the
    config property logits_scaling = hidden_size / dim_model_base: each a
    port field computed from config.json (checkpoint.config_keys)."""
    spec = _minicpm3_research(tmp_path).spec
    assert spec.unsupported is None
    assert spec.checkpoint.config_keys == MINICPM3_KEYS
    assert spec.residual.multiplier == pytest.approx(1.4 / 2**0.5)
    assert (spec.embedding.scale, spec.embedding.multiplier) == ("multiplier", 12.0)
    head = spec.lm_head
    assert (head.logits_divisor, head.logits_key, head.logits_form) == (0.25, "logits_scaling", "divisor")


def test_a_field_config_json_lacks_is_reported_not_dropped_silently(tmp_path):
    """A config.json without dim_model_base: logits_scaling cannot be
    computed from it, and research says so (the port would read 1.0)."""
    from autoport_cst.research import research
    from autoport_cst.validate import build_tiny_checkpoint

    source = tmp_path / "minicpm3"
    build_tiny_checkpoint("MiniCPM3ForCausalLM", source, seed=0)
    config = json.loads((source / "config.json").read_text())
    del config["dim_model_base"]
    (source / "config.json").write_text(json.dumps(config))
    result = research(str(source))
    assert "checkpoint.config_keys" in result.unknown
    assert "logits_scaling" not in (result.spec.checkpoint.config_keys or {})
    assert result.spec.checkpoint.config_keys["residual_multiplier"] == MINICPM3_KEYS["residual_multiplier"]


def _read_config_keys(keys: dict[str, str]):
    cls = get_codemod("config-key-aliases")
    config = (MODEL.parent / "config.py").read_text()
    out = run_on_source(cls(cls.parse_params({"keys": keys})), config, "config.py", "config", PortContext())[
        0
    ]
    tree = ast.parse(out)
    functions = [
        n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in ("_read_config_keys", "_unset")
    ]
    namespace: dict = {}
    exec(compile(ast.Module(body=functions, type_ignores=[]), "config.py", "exec"), namespace)
    return namespace["_read_config_keys"]


@settings(max_examples=25, deadline=None)
@given(
    scale_depth=st.floats(0.1, 8.0),
    layers=st.integers(1, 96),
    hidden=st.sampled_from([64, 256, 2560]),
    base=st.sampled_from([64, 256, 1024]),
    scale_emb=st.floats(1.0, 16.0),
)
def test_the_port_computes_minicpm3_multipliers_as_transformers(scale_depth, layers, hidden, base, scale_emb):
    """For any MiniCPM3 config, the port's config reads the multipliers
    transformers computes (its config's logits_scaling property, its
    decoder layer's residual_scale)."""
    from transformers import MiniCPM3Config

    config = MiniCPM3Config(
        hidden_size=hidden,
        num_attention_heads=4,
        num_hidden_layers=layers,
        dim_model_base=base,
        scale_depth=scale_depth,
        scale_emb=scale_emb,
    )
    values = {k: v for k, v in config.to_dict().items() if k != "logits_scaling"}
    _read_config_keys(MINICPM3_KEYS)(values)
    assert values["residual_multiplier"] == pytest.approx(config.scale_depth / math.sqrt(layers), rel=1e-12)
    assert values["logits_scaling"] == pytest.approx(config.logits_scaling, rel=1e-12)
    assert values["embedding_multiplier"] == config.scale_emb


def test_embedding_multiplier_inside_the_module_leaves_the_forward_alone():
    source = MODEL.read_text()
    cls = get_codemod("embedding-multiplier")
    params = cls.parse_params({"inside": True})
    out = run_on_source(cls(params), source, "model.py", "model", PortContext())[0]
    again = run_on_source(cls(params), out, "model.py", "model", PortContext())[0]
    assert again == out
    compile(out, "model.py", "exec")
    assert "embed_scale=config.embedding_multiplier" in out and "class ScaledVocabEmbedding(" in out
    assert "self.embedding_multiplier" not in out


@pytest.mark.slow
def test_minicpm3_ports_and_validates(tmp_path):
    """TP=1 fp32 and bf16 and TP=2, and the config variant that changes
    scale_depth, scale_emb and dim_model_base (the port computes its
    multipliers from them at run time)."""
    code, data, output = _port(tmp_path, "MiniCPM3ForCausalLM")
    assert code == 0, output
    assert data.get("reference") == "deepseek_v3", data
    steps = set(data.get("steps") or ())
    assert {"no-experts", "rotate-half-rope", "config-key-aliases", "residual-multiplier"} <= steps, steps
    assert {"embedding-multiplier", "logits-divisor"} <= steps, steps
    assert "config variant" in output and "scale_depth" in output and "dim_model_base" in output, output
    assert (tmp_path / "out" / "vllm_neuron").exists()
