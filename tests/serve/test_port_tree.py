"""Finding the port tree and reading its registry without importing it
(serve/port_tree.py)."""

from __future__ import annotations

import pytest

from autoport_cst.errors import InputError
from autoport_cst.serve.port_tree import (
    PORT_DIR_VARIABLE,
    find_port_tree,
    match_architecture,
    registry_architectures,
    registry_packages,
)

REGISTRY = """
from .qwen2 import Qwen2ForCausalLM
from .llama import LlamaForCausalLM as Llama


def get_models() -> list[tuple[str, type]]:
    models = [
        ("Qwen2ForCausalLM", Qwen2ForCausalLM),
        ("LlamaForCausalLM", Llama),
    ]
    return models
"""


@pytest.fixture
def tree(tmp_path):
    registry = tmp_path / "vllm_neuron" / "model" / "registry.py"
    registry.parent.mkdir(parents=True)
    registry.write_text(REGISTRY)
    return tmp_path


def test_registry_read_as_code(tree):
    assert registry_architectures(tree) == ["Qwen2ForCausalLM", "LlamaForCausalLM"]
    assert registry_packages(tree) == {"Qwen2ForCausalLM": "qwen2", "LlamaForCausalLM": "llama"}


def test_found_from_variable_script_or_working_directory(tree, tmp_path, monkeypatch):
    monkeypatch.delenv(PORT_DIR_VARIABLE, raising=False)
    script = tree / "examples" / "vllm_neuron" / "models" / "llama" / "run.py"
    script.parent.mkdir(parents=True)
    assert find_port_tree(script=str(script), cwd="/") == tree.resolve()
    assert find_port_tree(script="", cwd=tree / "examples") == tree.resolve()
    monkeypatch.setenv(PORT_DIR_VARIABLE, str(tree))
    assert find_port_tree(script="", cwd="/") == tree.resolve()
    monkeypatch.setenv(PORT_DIR_VARIABLE, str(tmp_path / "elsewhere"))
    with pytest.raises(InputError, match="no vllm_neuron/model/registry.py"):
        find_port_tree()


def test_nothing_found_says_what_to_set(tmp_path, monkeypatch):
    monkeypatch.delenv(PORT_DIR_VARIABLE, raising=False)
    with pytest.raises(InputError, match=PORT_DIR_VARIABLE):
        find_port_tree(script=str(tmp_path / "x.py"), cwd=tmp_path)


def test_architecture_matched_exactly(tree):
    registered = registry_architectures(tree)
    assert match_architecture("LlamaForCausalLM", registered, "registry.py") == "LlamaForCausalLM"
    with pytest.raises(InputError, match="differs|case included"):
        match_architecture("LLaMAForCausalLM", registered, "registry.py")
    with pytest.raises(InputError, match="no entry for 'MistralForCausalLM'"):
        match_architecture("MistralForCausalLM", registered, "registry.py")


def test_unparsable_registry_is_positioned(tree):
    (tree / "vllm_neuron" / "model" / "registry.py").write_text("def get_models(:\n")
    with pytest.raises(InputError, match=r"registry.py:1: the registry does not parse"):
        registry_architectures(tree)
