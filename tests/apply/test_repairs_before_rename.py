"""Repair steps run on the reference as it is, before rename-classes: the
repair of a config alias (config-written-names) looks the config class up in
transformers by its name, which a port under another name renames. Ported as
``tiny_q3m`` from the real vllm_neuron qwen3_moe (whose config reads
``num_experts``, written by transformers 5 as ``num_local_experts``), the
repair ran after the rename, found no ``TinyQ3mConfig`` in transformers and
changed nothing: the port kept 128 experts and failed at build. A repair
step whose rule still fires after it is now the step's error."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from autoport_cst.reference_models import builtin_references

from autoport_cst.apply import build_port, load_reference
from autoport_cst.apply.composer import repairs
from autoport_cst.plan import load_plan

ALIASES = '"num_experts": ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"),'


def _reading_num_experts_only(into: Path) -> Path:
    """A copy of the qwen3_moe reference whose config no longer reads ``num_local_experts``."""
    target = into / "qwen3_moe"
    shutil.copytree(builtin_references()["qwen3_moe"], target, ignore=shutil.ignore_patterns("__pycache__"))
    config = target / "config.py"
    text = config.read_text(encoding="utf-8")
    assert text.count(ALIASES) == 1
    config.write_text(text.replace(ALIASES, ALIASES.replace(' "num_local_experts",', "")), encoding="utf-8")
    return target


def test_a_config_alias_is_repaired_in_a_port_under_another_name(tmp_path, repo_root):
    reference = load_reference(str(_reading_num_experts_only(tmp_path)))
    assert repairs(reference) == ["config-written-names"]
    plan = json.loads((repo_root / "examples" / "qwen3_moe.plan.json").read_text(encoding="utf-8"))
    plan.update(name="tiny_q3m", class_prefix="TinyQ3m")
    path = tmp_path / "tiny_q3m.plan.json"
    path.write_text(json.dumps(plan), encoding="utf-8")

    result = build_port(load_plan(path), reference)
    assert result.ok, result.failure
    steps = [s.codemod for s in result.steps]
    assert steps.index("config-written-names") < steps.index("rename-classes")
    config = result.files[f"{result.package_dir}/config.py"]
    assert "class TinyQ3mConfig" in config
    assert "    num_local_experts: int | None = None\n" in config
    assert "            self.num_experts = self.num_local_experts\n" in config


def test_a_repair_that_leaves_its_finding_refuses_positioned(tmp_path, repo_root, monkeypatch):
    """A repair step whose rule still fires after it (here: config-written-names
    made to change nothing) is the step's error, at the finding in the
    reference file: no port is written with the reference's latent bug."""
    from autoport_cst.transform.library import get_codemod

    reference = load_reference(str(_reading_num_experts_only(tmp_path)))
    monkeypatch.setattr(
        get_codemod("config-written-names"), "transform_module", lambda self, module, ctx: module
    )
    result = build_port(load_plan(repo_root / "examples" / "qwen3_moe.plan.json"), reference)
    assert not result.ok
    message = str(result.failure)
    assert "repair step config-written-names left NRN008" in message
    line = next(
        number
        for number, text in enumerate((tmp_path / "qwen3_moe" / "config.py").read_text().splitlines(), 1)
        if text.strip().startswith("num_experts:")
    )
    assert message.startswith(f"qwen3_moe/config.py:{line}:5: ")
