"""apply parses each file of the reference once: the steps hand the module on,
and the hardware-rule check lints the modules the engine holds (the port's
with its banner, the reference's as parsed) with the same findings as
linting the written text."""

from __future__ import annotations

import json
from collections import Counter

import libcst as cst
import pytest

from autoport_cst.apply import PortResult, build_port, load_reference
from autoport_cst.apply.engine import _banner, _banner_line, _bannered_module, _check_hardware_rules
from autoport_cst.plan import parse_plan


def _port(repo_root, name: str) -> tuple[PortResult, Counter]:
    data = json.loads((repo_root / "examples" / f"{name}.plan.json").read_text())
    reference = load_reference(data["reference"])
    parsed: Counter = Counter()
    original = cst.parse_module

    def counting(source, *args, **kwargs):
        parsed[source] += 1
        return original(source, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cst, "parse_module", counting)
        result = build_port(parse_plan(data), reference)
    assert result.ok, result.failure
    return result, parsed


@pytest.mark.parametrize("name", ["qwen2", "gemma2"])
def test_each_reference_file_is_parsed_once_and_no_port_file_again(repo_root, name):
    result, parsed = _port(repo_root, name)
    for path, source in result.sources.items():
        if path.endswith(".py"):
            assert parsed[source] == 1, path
    for path, text in result.files.items():
        if path.endswith(".py") and text != result.sources.get(path):
            assert parsed[text] == 0, path


@pytest.mark.parametrize("name", ["qwen2", "gemma2", "qwen3_moe"])
def test_the_findings_on_the_engines_modules_are_those_of_the_written_text(repo_root, name):
    result, _ = _port(repo_root, name)
    again = PortResult(plan=result.plan, reference=result.reference)
    again.files, again.sources = result.files, result.sources
    _check_hardware_rules(again, result.package_dir)  # no modules: parses the texts
    assert again.warnings == result.warnings


def test_the_bannered_module_is_the_parsed_bannered_text(repo_root):
    files = sorted((repo_root / "reference_models").glob("*/*.py"))
    assert files
    for path in files:
        text = path.read_text()
        parsed = cst.parse_module(text)  # once per file: a module is immutable
        for reference, name in (("llama3", "qwen2"), ("llama3", "llama3")):
            bannered = _banner(text, reference, name)
            module = _bannered_module(parsed, text, _banner_line(reference, name))
            assert module is not None, path
            assert module.code == bannered, path
            assert module.deep_equals(cst.parse_module(bannered)), path
    # a port of a port keeps its banner
    text = _banner("x = 1\n", "llama3", "qwen2")
    module = cst.parse_module(text)
    assert _bannered_module(module, text, _banner_line("llama3", "qwen2")) is module


def test_a_hardware_rule_broken_by_the_port_is_refused_from_the_modules():
    from autoport_cst.errors import InputError

    clean = "class LlamaAttention(nn.Module):\n    def forward(self, x):\n        return x\n"
    broken = "class LlamaAttention(nn.Module):\n    def forward(self, x):\n        return x.item()\n"
    result = PortResult(plan=None, reference=None)  # type: ignore[arg-type]
    result.files = {"pkg/model.py": broken}
    result.sources = {"pkg/model.py": clean}
    modules = {"pkg/model.py": (cst.parse_module(broken), cst.parse_module(clean))}
    with pytest.raises(InputError) as caught:
        _check_hardware_rules(result, "pkg", modules)
    assert "NRN003" in str(caught.value) and "pkg/model.py:3:" in str(caught.value)
    # the same error in the reference file is inherited
    result.sources = {"pkg/model.py": broken}
    modules = {"pkg/model.py": (cst.parse_module(broken), cst.parse_module(broken))}
    _check_hardware_rules(result, "pkg", modules)
    assert [d.note for d in result.warnings] == ["inherited from the reference, not made by the port"]
