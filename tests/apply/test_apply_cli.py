"""`autoport-cst apply` end to end on the bundled qwen2 example, and its
handling of bad input: exit code 2, a clear message, nothing written."""

from __future__ import annotations

import ast
import json
import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from autoport_cst.cli import cli

ROOT = Path(__file__).resolve().parents[2]
QWEN2_PLAN = ROOT / "examples" / "qwen2.plan.json"


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def tree(path: Path) -> dict[str, str]:
    return (
        {p.relative_to(path).as_posix(): p.read_text() for p in sorted(path.rglob("*")) if p.is_file()}
        if path.exists()
        else {}
    )


@pytest.fixture(scope="module")
def qwen2_port(tmp_path_factory):
    out = tmp_path_factory.mktemp("port")
    result = run("apply", "--plan", QWEN2_PLAN, "--out", out)
    assert result.exit_code == 0, result.output
    return out


def classes_of(source: str) -> dict[str, ast.ClassDef]:
    return {n.name: n for n in ast.parse(source).body if isinstance(n, ast.ClassDef)}


def test_port_files(qwen2_port):
    assert sorted(tree(qwen2_port)) == [
        "examples/vllm_neuron/models/qwen2/run.py",
        "test/vllm_neuron/model/qwen2/test_qwen2_logits.py",
        "vllm_neuron/model/qwen2/README.md",
        "vllm_neuron/model/qwen2/__init__.py",
        "vllm_neuron/model/qwen2/config.py",
        "vllm_neuron/model/qwen2/factory.py",
        "vllm_neuron/model/qwen2/model.py",
        "vllm_neuron/model/qwen2/quantization.py",
        "vllm_neuron/model/qwen2/reference.json",
        "vllm_neuron/model/registry.py",
    ]


def test_port_has_the_expected_classes_and_parameters(qwen2_port):
    package = qwen2_port / "vllm_neuron" / "model" / "qwen2"
    model = (package / "model.py").read_text()
    assert set(classes_of(model)) == {
        "Qwen2RMSNorm",
        "Qwen2RotaryEmbedding",
        "Qwen2Attention",
        "Qwen2MLP",
        "Qwen2DecoderLayer",
        "Qwen2Model",
        "Qwen2ForCausalLM",
    }
    assert "Llama" not in "".join(classes_of(model))
    assert "self.qkv_proj_bias = nn.Parameter(torch.zeros(qkv_size, dtype=self.dtype))" in model
    assert "o_proj_bias" not in model
    assert "bias=self.qkv_proj_bias.unsqueeze(0)" in model
    assert "bias_qkv=self.qkv_proj_bias.unsqueeze(0)" in model
    assert 'mappings[f"{prefix}.self_attn.qkv_proj_bias"] = [' in model
    assert 'f"{prefix}.self_attn.q_proj.bias"' in model
    assert 'if rope_type == "llama3":' in model  # a rope-type string, not a class name
    assert "class Qwen2Config" in (package / "config.py").read_text()
    assert "from .model import Qwen2ForCausalLM as Model" in (package / "factory.py").read_text()
    init = (package / "__init__.py").read_text()
    assert '__all__ = ["Qwen2Config", "Qwen2ForCausalLM"]' in init
    run_py = (qwen2_port / "examples/vllm_neuron/models/qwen2/run.py").read_text()
    assert 'MODEL_NAME = "qwen2"' in run_py and 'HF_ARCHITECTURE = "Qwen2ForCausalLM"' in run_py
    for path, text in tree(qwen2_port).items():
        if path.endswith(".py"):
            compile(text, path, "exec")


def test_port_manifest_records_spec_and_provenance(qwen2_port):
    manifest = json.loads((qwen2_port / "vllm_neuron/model/qwen2/reference.json").read_text())
    assert manifest["name"] == "qwen2" and manifest["class_prefix"] == "Qwen2"
    assert manifest["spec"]["attention"]["qkv_bias"] is True
    assert manifest["provenance"]["reference"] == "llama3"
    assert manifest["provenance"]["steps"] == [
        "rename-classes",
        "add-qkv-bias",
        "set-constants",
        "register-model",
    ]


def test_registry_entry(qwen2_port):
    registry = (qwen2_port / "vllm_neuron/model/registry.py").read_text()
    assert "from .qwen2 import Qwen2ForCausalLM" in registry
    assert '("Qwen2ForCausalLM", Qwen2ForCausalLM),' in registry


def test_check_is_clean_after_apply(qwen2_port):
    result = run("apply", "--plan", QWEN2_PLAN, "--out", qwen2_port, "--check")
    assert result.exit_code == 0, result.output


def test_applying_twice_keeps_one_registry_entry(tmp_path):
    for _ in range(2):
        result = run("apply", "--plan", QWEN2_PLAN, "--out", tmp_path)
        assert result.exit_code == 0, result.output
    for _ in range(2):
        result = run("apply", "--plan", QWEN2_PLAN, "--out", tmp_path, "--force")
        assert result.exit_code == 0, result.output
    registry = (tmp_path / "vllm_neuron/model/registry.py").read_text()
    assert registry.count('("Qwen2ForCausalLM", Qwen2ForCausalLM)') == 1
    assert registry.count("from .qwen2 import Qwen2ForCausalLM") == 1


def test_check_reports_a_changed_file(tmp_path):
    assert run("apply", "--plan", QWEN2_PLAN, "--out", tmp_path).exit_code == 0
    model = tmp_path / "vllm_neuron/model/qwen2/model.py"
    model.write_text(model.read_text() + "\n# hand edit\n")
    result = run("apply", "--plan", QWEN2_PLAN, "--out", tmp_path, "--check")
    assert result.exit_code == 1
    assert "vllm_neuron/model/qwen2/model.py" in result.output
    (tmp_path / "vllm_neuron/model/qwen2/stale.py").write_text("x = 1\n")
    result = run("apply", "--plan", QWEN2_PLAN, "--out", tmp_path, "--check")
    assert "stale.py" in result.output


def test_existing_package_needs_force(tmp_path):
    assert run("apply", "--plan", QWEN2_PLAN, "--out", tmp_path).exit_code == 0
    model = tmp_path / "vllm_neuron/model/qwen2/model.py"
    model.write_text("# hand edit\n")
    (tmp_path / "vllm_neuron/model/qwen2/stale.py").write_text("x = 1\n")
    before = tree(tmp_path)
    result = run("apply", "--plan", QWEN2_PLAN, "--out", tmp_path)
    assert result.exit_code == 2
    assert "already exists" in result.output and "--force" in result.output
    assert tree(tmp_path) == before
    result = run("apply", "--plan", QWEN2_PLAN, "--out", tmp_path, "--force")
    assert result.exit_code == 0
    assert "hand edit" not in model.read_text()
    assert not (tmp_path / "vllm_neuron/model/qwen2/stale.py").exists()


def test_registry_keeps_other_models(tmp_path):
    registry = tmp_path / "vllm_neuron/model/registry.py"
    registry.parent.mkdir(parents=True)
    registry.write_text(
        "from .llama3 import LlamaForCausalLM\n\n\ndef get_models():\n"
        '    models = [\n        ("LlamaForCausalLM", LlamaForCausalLM),\n    ]\n    return models\n'
    )
    assert run("apply", "--plan", QWEN2_PLAN, "--out", tmp_path).exit_code == 0
    text = registry.read_text()
    assert '("LlamaForCausalLM", LlamaForCausalLM),\n        ("Qwen2ForCausalLM", Qwen2ForCausalLM),' in text


def test_diff_writes_nothing(tmp_path):
    result = run("apply", "--plan", QWEN2_PLAN, "--diff", "--out", tmp_path / "out")
    assert result.exit_code == 0, result.output
    assert "--- a/llama3/model.py" in result.output
    assert "+++ b/vllm_neuron/model/qwen2/model.py" in result.output
    assert "+        self.qkv_proj_bias = nn.Parameter" in result.output
    assert not (tmp_path / "out").exists()


def test_json_summary(tmp_path):
    result = run("apply", "--plan", QWEN2_PLAN, "--out", tmp_path, "--output-format", "json")
    assert result.exit_code == 0
    data = json.loads(result.output)
    assert [s["codemod"] for s in data["steps"]] == [
        "rename-classes",
        "add-qkv-bias",
        "set-constants",
        "register-model",
    ]
    rename = data["steps"][0]
    assert any("Llama -> Qwen2" in note for note in rename["notes"])
    assert "vllm_neuron/model/qwen2/model.py" in data["written"]


def test_a_port_can_be_the_next_reference(tmp_path, qwen2_port):
    plan = tmp_path / "qwen2_o.plan.json"
    data = json.loads(QWEN2_PLAN.read_text())
    data.update(name="qwen2_obias", class_prefix="Qwen2OBias", architecture="Qwen2OBiasForCausalLM")
    data["spec"]["attention"]["o_bias"] = True
    plan.write_text(json.dumps(data))
    result = run(
        "apply", "--plan", plan, "--ref", qwen2_port / "vllm_neuron/model/qwen2", "--out", tmp_path / "out"
    )
    assert result.exit_code == 0, result.output
    model = (tmp_path / "out/vllm_neuron/model/qwen2_obias/model.py").read_text()
    assert "class Qwen2OBiasAttention" in model
    assert "self.o_proj_bias = nn.Parameter" in model
    assert model.count("def fused_qkv_bias_loader") == 1


# -- bad input: exit 2, a clear message, nothing written ----------------------


def write_plan(tmp_path, data) -> Path:
    path = tmp_path / "plan.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


BASE = {"version": 1, "name": "demo", "architecture": "DemoForCausalLM", "reference": "llama3"}


@pytest.mark.parametrize(
    "plan, args, message",
    [
        ('{"version": 1, "name": ', [], "malformed JSON"),
        ({**BASE, "spec": {"norm": {"kind": "batchnorm"}}}, [], "$.spec.norm.kind"),
        ({**BASE, "name": "Demo"}, [], "$.name"),
        (BASE, ["--ref", "no_such_reference"], "unknown reference 'no_such_reference'"),
        ({**BASE, "steps": [{"codemod": "no-such-codemod"}]}, [], "unknown codemod 'no-such-codemod'"),
        ({**BASE, "steps": [{"codemod": "swap-norm", "params": {"kind": 1}}]}, [], "$.steps[0].params.kind"),
        ({**BASE, "spec": {"moe": {"num_experts": 4, "top_k": 2}}}, [], "no codemod realizes 1 field(s)"),
        ({**BASE, "steps": [{"codemod": "float32-router"}]}, [], "no MoE router weight"),
        ({k: v for k, v in BASE.items() if k != "reference"}, [], "no reference"),
    ],
    ids=[
        "malformed-json",
        "schema-violation",
        "bad-name",
        "unknown-reference",
        "unknown-codemod",
        "bad-params",
        "unrealizable-diff",
        "failed-precondition",
        "no-reference",
    ],
)
def test_bad_input(tmp_path, plan, args, message):
    out = tmp_path / "out"
    result = run("apply", "--plan", write_plan(tmp_path, plan), "--out", out, *args)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert result.output.startswith("error:") or "\nerror:" in result.output or "error:" in result.output
    assert not out.exists()


def test_failed_precondition_is_positioned(tmp_path):
    result = run(
        "apply",
        "--plan",
        write_plan(tmp_path, {**BASE, "steps": [{"codemod": "float32-router"}]}),
        "--out",
        tmp_path / "out",
    )
    assert "llama3/model.py: float32-router" in result.output


def test_reference_directory_without_manifest(tmp_path):
    ref = tmp_path / "ref"
    shutil.copytree(ROOT / "reference_models" / "llama3", ref)
    (ref / "reference.json").unlink()
    result = run("apply", "--plan", write_plan(tmp_path, BASE), "--ref", ref, "--out", tmp_path / "out")
    assert result.exit_code == 2
    assert "has no reference.json" in result.output


def test_reference_with_a_syntax_error(tmp_path):
    ref = tmp_path / "ref"
    shutil.copytree(ROOT / "reference_models" / "llama3", ref)
    model = ref / "model.py"
    model.write_text(model.read_text().replace("class LlamaMLP(nn.Module):", "class LlamaMLP(nn.Module:"))
    result = run("apply", "--plan", write_plan(tmp_path, BASE), "--ref", ref, "--out", tmp_path / "out")
    assert result.exit_code == 2
    assert "model.py:" in result.output and "cannot parse" in result.output
    assert not (tmp_path / "out").exists()


def test_usage_errors_exit_2(tmp_path):
    assert run("apply", "--plan", QWEN2_PLAN).exit_code == 2  # no --out
    assert run("apply", "--plan", QWEN2_PLAN, "--out", tmp_path, "--check", "--diff").exit_code == 2


def test_write_is_all_or_nothing(tmp_path, monkeypatch):
    """A failure in the middle of writing restores the previous state."""
    from autoport_cst.apply import writer

    assert run("apply", "--plan", QWEN2_PLAN, "--out", tmp_path).exit_code == 0
    (tmp_path / "vllm_neuron/model/qwen2/model.py").write_text("# old\n")
    (tmp_path / "vllm_neuron/model/qwen2/config.py").write_text("# old config\n")
    before = tree(tmp_path)
    real_replace = os.replace
    calls = {"n": 0}

    def failing_replace(src, dst):
        calls["n"] += 1
        if calls["n"] == 4:  # after the first file is in place, during the second
            raise OSError("disk full")
        return real_replace(src, dst)

    monkeypatch.setattr(writer.os, "replace", failing_replace)
    result = run("apply", "--plan", QWEN2_PLAN, "--out", tmp_path, "--force")
    assert result.exit_code == 2
    assert tree(tmp_path) == before
    assert not list(tmp_path.glob(".autoport-*"))


def test_a_hardware_rule_broken_by_the_reference_is_reported_not_refused(tmp_path):
    """A reference whose RoPE computes a tensor in __init__ gives a port with
    the same finding: the port did not make it, so it is written and the
    finding reported as inherited (the reference's owner decides)."""
    ref = tmp_path / "ref"
    shutil.copytree(ROOT / "reference_models" / "llama3", ref)
    model = ref / "model.py"
    text = model.read_text()
    anchor = '        self.rope_theta = float(self.rope_parameters["rope_theta"])\n'
    assert text.count(anchor) == 1
    model.write_text(
        text.replace(anchor, anchor + "        self.inv_freq = torch.arange(0, self.head_dim, 2).float()\n")
    )
    result = run("apply", "--plan", write_plan(tmp_path, BASE), "--ref", ref, "--out", tmp_path / "out")
    assert result.exit_code == 0, result.output
    assert "NRN001" in result.output and "inherited from the reference" in result.output


def test_a_hardware_rule_broken_by_the_port_is_refused():
    """An error the port has and its reference file has not stops the port,
    naming the rule and the position."""
    from autoport_cst.apply.engine import PortResult, _check_hardware_rules
    from autoport_cst.errors import InputError

    clean = "class LlamaAttention(nn.Module):\n    def forward(self, x):\n        return x\n"
    broken = "class LlamaAttention(nn.Module):\n    def forward(self, x):\n        return x.item()\n"
    result = PortResult(plan=None, reference=None)  # type: ignore[arg-type]
    result.files = {"pkg/model.py": broken}
    result.sources = {"pkg/model.py": clean}
    with pytest.raises(InputError) as caught:
        _check_hardware_rules(result, "pkg")
    assert "NRN003" in str(caught.value) and "pkg/model.py:3:" in str(caught.value)
