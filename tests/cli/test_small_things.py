"""The smaller things a new user meets: file permissions, a second port of
one architecture into one --out, tables in a log, the count of fixable
findings, --review without a terminal, names Python cannot import, and
"did you mean" for a misspelt codemod, reference, architecture or command."""

from __future__ import annotations

import json
import os
import stat
import textwrap

import pytest
from click.testing import CliRunner

from autoport_cst.cli import cli

from .conftest import LLAMA3, ROOT


def invoke(*args, **kwargs):
    return CliRunner().invoke(cli, [str(a) for a in args], **kwargs)


@pytest.fixture
def usual_umask():
    previous = os.umask(0o022)
    yield
    os.umask(previous)


def mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_written_files_have_the_usual_permissions(usual_umask, tmp_path):
    from autoport_cst.atomic import write_atomic

    write_atomic(tmp_path / "plan.json", "{}\n")  # what `plan -o` writes through
    assert mode(tmp_path / "plan.json") == 0o644
    os.chmod(tmp_path / "plan.json", 0o600)
    write_atomic(tmp_path / "plan.json", "{}\n")
    assert mode(tmp_path / "plan.json") == 0o600, "an existing file keeps its permissions"


def test_tiny_writes_files_readable_by_others(usual_umask, tmp_path):
    result = invoke("tiny", "LlamaForCausalLM", tmp_path / "ckpt")
    assert result.exit_code == 0, result.output
    assert mode(tmp_path / "ckpt" / "config.json") == 0o644
    assert mode(tmp_path / "ckpt" / "model.safetensors") == 0o644


def test_a_second_port_of_an_architecture_names_port_and_the_way_on(tiny_llama, tmp_path):
    """The --out already registers LlamaForCausalLM (as a first port does)."""
    out = tmp_path / "out"
    registry = out / "vllm_neuron" / "model" / "registry.py"
    registry.parent.mkdir(parents=True)
    registry.write_text(
        "from vllm_neuron.model.first.model import FirstLlamaForCausalLM\n\n\n"
        "def get_models() -> list[tuple[str, type]]:\n"
        '    models = [("LlamaForCausalLM", FirstLlamaForCausalLM)]\n'
        "    return models\n",
        encoding="utf-8",
    )
    result = invoke("port", tiny_llama, "--name", "second", "--out", out)
    assert result.exit_code == 2, result.output
    assert "already holds a port of LlamaForCausalLM" in result.output
    assert f"autoport-cst port {tiny_llama} --name second --out {out} --force" in result.output
    assert "apply --force" not in result.output
    assert f"{registry}:5: the registry maps 'LlamaForCausalLM' to FirstLlamaForCausalLM" in result.output
    assert not (out / "vllm_neuron" / "model" / "second").exists()


REGISTRY = """from .first import FirstLlamaForCausalLM


def get_models() -> list[tuple[str, type]]:
    models = [
        ("LlamaForCausalLM", FirstLlamaForCausalLM),
    ]
    return models
"""


def test_a_second_port_of_an_architecture_is_refused_before_torch(fake_llama, tmp_path):
    """As a first port writes its registry: found before the research, not
    after it (45 s of research and apply under load before)."""
    from autoport_cst.preflight import check_one_port_per_architecture

    from .conftest import LLAMA_CONFIG, run_cli

    out = tmp_path / "out"
    registry = out / "vllm_neuron" / "model" / "registry.py"
    registry.parent.mkdir(parents=True)
    registry.write_text(REGISTRY, encoding="utf-8")
    result = run_cli("port", fake_llama, "--name", "second", "--out", out)
    assert result.returncode == 2, result.stderr
    assert "already holds a port of LlamaForCausalLM" in result.stderr
    assert result.stderr.rstrip().endswith("torch not imported")
    assert not (out / "vllm_neuron" / "model" / "second").exists()
    # the same port again, and another architecture, are not this check's
    check_one_port_per_architecture(out, LLAMA_CONFIG, "first", str(fake_llama))
    check_one_port_per_architecture(out, {"architectures": ["Qwen2ForCausalLM"]}, "second", "q")
    check_one_port_per_architecture(out, None, "second", "someone/hub-model")


def test_tables_are_not_clipped_at_80_columns_in_a_log():
    result = invoke("codemods")
    assert result.exit_code == 0
    assert max(len(line) for line in result.output.splitlines()) > 80
    assert "…" not in result.output


ROPE_KEEPS_ITS_TENSOR = """
class LlamaRotaryEmbedding(nn.Module):
    def __init__(self, dim, base=10000):
        super().__init__()
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2).float() / dim))
        t = torch.arange(0, 128).float()
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.register_buffer("t", t, persistent=False)

    def forward(self, x, position_ids):
        freqs = torch.outer(position_ids.float(), self.inv_freq)
        return freqs.cos(), freqs.sin()
"""

ROPE = """
class LlamaRotaryEmbedding(nn.Module):
    def __init__(self, dim, base=10000):
        super().__init__()
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2).float() / dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, x, position_ids):
        freqs = torch.outer(position_ids.float(), self.inv_freq)
        return freqs.cos(), freqs.sin()
"""


def test_fixable_counts_what_fix_would_fix(tmp_path):
    kept = tmp_path / "kept.py"
    kept.write_text(textwrap.dedent(ROPE_KEEPS_ITS_TENSOR).lstrip())
    listed = invoke("lint", "--no-cache", kept)
    assert "Found 2 errors" in listed.stderr
    assert "fixable with --fix" not in listed.stderr, "lazy-rope does not apply: the class keeps t"
    assert "Would fix 0" in invoke("lint", "--no-cache", "--diff", kept).stderr

    rope = tmp_path / "rope.py"
    rope.write_text(textwrap.dedent(ROPE).lstrip())
    assert "1 fixable with --fix" in invoke("lint", "--no-cache", rope).stderr


def test_plan_review_without_an_answer_is_bad_input(tiny_llama, tmp_path):
    out = tmp_path / "plan.json"
    result = invoke("plan", tiny_llama, "--name", "x", "-o", out, "--review", input="")
    assert result.exit_code == 2, result.output
    assert "stdin ended without an answer" in result.output
    assert "internal error" not in result.output and not out.exists()


def test_reserved_words_cannot_name_a_port(fake_llama, tmp_path):
    for args in (
        ("port", fake_llama, "--name", "class", "--out", tmp_path / "out"),
        ("plan", fake_llama, "--name", "class", "-o", tmp_path / "plan.json"),
    ):
        result = invoke(*args)
        assert result.exit_code == 2, result.output
        assert "'class' is a Python keyword" in result.output
    assert not (tmp_path / "out").exists() and not (tmp_path / "plan.json").exists()
    plan = json.loads((ROOT / "examples" / "qwen2.plan.json").read_text(encoding="utf-8"))
    plan["name"] = "import"
    (tmp_path / "keyword.plan.json").write_text(json.dumps(plan), encoding="utf-8")
    result = invoke("apply", "--plan", tmp_path / "keyword.plan.json", "--out", tmp_path / "out")
    assert result.exit_code == 2 and "'import' is a Python keyword" in result.output, result.output


@pytest.mark.parametrize(
    "args, suggestion",
    [
        (("codemods", "show", "rename-class"), "did you mean 'rename-classes'?"),
        (("port", "{ckpt}", "--name", "x", "--out", "{tmp}", "--ref", "lama3"), "did you mean 'llama3'?"),
        (("tiny", "LlamaForCausalLm", "{tmp}"), "did you mean 'LlamaForCausalLM'?"),
        # each suggestion once: the causal-LM mapping names an architecture under several model types
        (("tiny", "LlamForCausalLM", "{tmp}"), "did you mean 'LlamaForCausalLM' or 'Llama4ForCausalLM' or "),
        (("valdate",), "did you mean 'validate'?"),
    ],
)
def test_did_you_mean(args, suggestion, fake_llama, tmp_path):
    result = invoke(*(a.format(ckpt=fake_llama, tmp=tmp_path / "out") for a in args))
    assert result.exit_code == 2, result.output
    assert suggestion in result.output


def test_did_you_mean_names_each_choice_once():
    from autoport_cst.errors import did_you_mean

    assert did_you_mean("lama3", ["llama3", "llama3", "qwen3"]) == " (did you mean 'llama3'?)"


def test_did_you_mean_for_a_plan_step(tmp_path):
    plan = json.loads((ROOT / "examples" / "qwen2.plan.json").read_text(encoding="utf-8"))
    plan["steps"] = [{"codemod": "qk-norms", "params": {}}]
    (tmp_path / "p.plan.json").write_text(json.dumps(plan), encoding="utf-8")
    result = invoke("apply", "--plan", tmp_path / "p.plan.json", "--diff", "--ref", LLAMA3)
    assert result.exit_code == 2
    assert "did you mean 'qk-norm'" in result.output


@pytest.mark.parametrize(
    "model_type, name",
    [
        ("openai-gpt", "openai_gpt"),
        ("modernbert-decoder", "modernbert_decoder"),
        ("Qwen2", "qwen2"),
        ("class", "class_model"),
        ("4bit", "model_4bit"),
    ],
)
def test_a_model_type_becomes_a_package_name(model_type, name):
    from autoport_cst.plan.naming import model_name_problem, name_for_model_type

    assert name_for_model_type(model_type) == name
    assert model_name_problem(name) is None


def test_without_name_the_plan_is_named_after_the_model_type(tiny_llama, tmp_path):
    out = tmp_path / "plan.json"
    result = invoke("plan", tiny_llama, "-o", out)
    assert result.exit_code == 0, result.output
    assert json.loads(out.read_text(encoding="utf-8"))["name"] == "llama"


def test_a_name_is_derived_from_the_config_or_asked_for():
    from autoport_cst.errors import InputError
    from autoport_cst.preflight import default_model_name

    assert default_model_name({"model_type": "openai-gpt"}, "ckpt") == "openai_gpt"
    for config, why in ((None, "a hub id's config is read only later"), ({}, "has no model_type")):
        with pytest.raises(InputError, match="give --name") as raised:
            default_model_name(config, "owner/model")
        assert why in str(raised.value)
