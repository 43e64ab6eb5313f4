"""Companions: every reference's example script is made from one template
(``apply/companion_templates.py``), with the expert-parallel option when the
reference has experts; a reference may still ship its own file."""

from __future__ import annotations

import ast
import json
import shutil
from pathlib import Path

import pytest
from autoport_cst.reference_models import builtin_references
from click.testing import CliRunner

from autoport_cst.apply import load_reference
from autoport_cst.cli import cli
from autoport_cst.errors import InputError

ROOT = Path(__file__).resolve().parents[2]


def constants(source: str) -> dict[str, object]:
    values = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            try:
                values[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                continue
    return values


def test_no_builtin_reference_holds_a_copy():
    for name, directory in builtin_references().items():
        assert not (directory / "companions").exists(), f"{name}: companions/ copy instead of the template"


@pytest.mark.parametrize("name", sorted(builtin_references()))
def test_each_builtin_reference_gets_its_script_from_the_template(name):
    reference = load_reference(name)
    script = reference.companions["run.py"]
    tree = ast.parse(script)
    values = constants(script)
    assert values["MODEL_NAME"] == reference.name
    assert values["HF_ARCHITECTURE"] == reference.manifest.architecture
    assert values["TP_SIZE"] == 2
    docstring = ast.get_docstring(tree) or ""
    assert docstring.startswith(f"Generate text with the {reference.class_prefix} port")
    has_experts = reference.spec.moe is not None
    assert ('"--ep"' in script) is has_experts
    assert ("enable_expert_parallel=args.ep > 1" in script) is has_experts
    assert ("[--ep 2]" in docstring) is has_experts


def test_a_new_reference_needs_no_copy(tmp_path):
    ref = tmp_path / "ref"
    shutil.copytree(
        ROOT / "reference_models" / "qwen3_moe", ref, ignore=shutil.ignore_patterns("__pycache__")
    )
    manifest = json.loads((ref / "reference.json").read_text())
    manifest.update(name="my_moe", class_prefix="MyMoe", architecture="MyMoeForCausalLM")
    (ref / "reference.json").write_text(json.dumps(manifest))
    script = load_reference(str(ref)).companions["run.py"]
    assert constants(script)["MODEL_NAME"] == "my_moe"
    assert constants(script)["HF_ARCHITECTURE"] == "MyMoeForCausalLM"
    assert "with the MyMoe port" in script and '"--ep"' in script


def test_a_reference_may_ship_its_own(tmp_path):
    ref = tmp_path / "ref"
    shutil.copytree(ROOT / "reference_models" / "llama3", ref, ignore=shutil.ignore_patterns("__pycache__"))
    (ref / "companions").mkdir()
    (ref / "companions" / "run.py").write_text('MODEL_NAME = "llama3"\n')
    assert load_reference(str(ref)).companions == {"run.py": 'MODEL_NAME = "llama3"\n'}


def test_a_companion_without_file_or_template_is_refused(tmp_path):
    ref = tmp_path / "ref"
    shutil.copytree(ROOT / "reference_models" / "llama3", ref, ignore=shutil.ignore_patterns("__pycache__"))
    manifest = json.loads((ref / "reference.json").read_text())
    manifest["companions"]["serve.py"] = "examples/{name}/serve.py"
    (ref / "reference.json").write_text(json.dumps(manifest))
    with pytest.raises(InputError, match=r"companions/serve.py is missing") as raised:
        load_reference(str(ref))
    assert raised.value.position is not None
    assert raised.value.position.json_path == "$.companions.serve.py"


def test_an_moe_port_gets_the_expert_parallel_option(tmp_path):
    plan = ROOT / "examples" / "mixtral.plan.json"
    result = CliRunner().invoke(cli, ["apply", "--plan", str(plan), "--out", str(tmp_path), "-q"])
    assert result.exit_code == 0, result.output
    script = (tmp_path / "examples/vllm_neuron/models/mixtral/run.py").read_text()
    assert constants(script)["MODEL_NAME"] == "mixtral"
    assert constants(script)["HF_ARCHITECTURE"] == "MixtralForCausalLM"
    assert "with the Mixtral port" in script and '"--ep"' in script
    compile(script, "run.py", "exec")


def _script_module(tmp_path: Path):
    """The llama3 reference's run.py, imported (it imports vLLM only in main)."""
    import importlib.util

    script = tmp_path / "run.py"
    script.write_text(load_reference("llama3").companions["run.py"], encoding="utf-8")
    spec = importlib.util.spec_from_file_location("run_script", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    "heads, kv_heads, positions, expected",
    [(4, 2, 512, (2, 512)), (6, 2, 4096, (2, 4096)), (3, 3, 128, (1, 128)), (4, 1, None, (2, None))],
)
def test_the_script_takes_its_defaults_from_the_checkpoint(tmp_path, heads, kv_heads, positions, expected):
    module = _script_module(tmp_path)
    config = {"num_attention_heads": heads, "num_key_value_heads": kv_heads}
    if positions is not None:
        config["max_position_embeddings"] = positions
    (tmp_path / "config.json").write_text(json.dumps(config), encoding="utf-8")
    assert module.checkpoint_limits(str(tmp_path)) == expected
    assert module.checkpoint_limits("owner/hub-model") == (module.TP_SIZE, None)


def test_a_context_longer_than_the_checkpoint_is_refused(tmp_path, monkeypatch, capsys):
    module = _script_module(tmp_path)
    (tmp_path / "config.json").write_text(
        json.dumps({"num_attention_heads": 4, "max_position_embeddings": 512}), encoding="utf-8"
    )
    monkeypatch.setattr("sys.argv", ["run.py", "--model", str(tmp_path), "--max-model-len", "2048"])
    with pytest.raises(SystemExit) as exited:
        module.main()
    assert exited.value.code == 2
    assert "exceeds the checkpoint's 512 positions" in capsys.readouterr().err
