"""A port is imported under its real package name, ``vllm_neuron.model.<name>``,
so its absolute imports of its own modules work, and ``sys.modules`` is left
as it was."""

from __future__ import annotations

import shutil
import sys
import types
from pathlib import Path

from autoport_cst.validate import validate_model
from autoport_cst.validate.package import imported_package
from autoport_cst.validate.standin import standin_installed


def _absolute_port(llama3_dir: Path, tmp_path: Path) -> Path:
    target = tmp_path / "absolute_port"
    shutil.copytree(llama3_dir, target, ignore=shutil.ignore_patterns("__pycache__"))
    init = target / "__init__.py"
    init.write_text(
        init.read_text(encoding="utf-8")
        + "\nfrom vllm_neuron.model.absolute_port.config import LlamaConfig as _AbsoluteConfig  # noqa: E402,F401\n",
        encoding="utf-8",
    )
    return target


def test_absolute_imports_of_the_package_work(llama3_dir: Path, tiny_llama: Path, tmp_path: Path) -> None:
    port = _absolute_port(llama3_dir, tmp_path)
    report = validate_model(port, tiny_llama, dtype="fp32", steps=2)
    assert report.equivalent, report.summary()
    assert not [name for name in sys.modules if name.startswith(("vllm_neuron", "vllm."))]


def test_the_package_takes_its_real_name_and_gives_it_back(llama3_dir: Path, tmp_path: Path) -> None:
    port = _absolute_port(llama3_dir, tmp_path)
    with standin_installed():
        model_package = sys.modules["vllm_neuron.model"]
        previous = types.ModuleType("vllm_neuron.model.absolute_port")
        sys.modules[previous.__name__] = previous
        with imported_package(port) as package:
            assert package.module.__name__ == "vllm_neuron.model.absolute_port"
            assert sys.modules["vllm_neuron.model.absolute_port.config"].__file__ == str(port / "config.py")
            assert model_package.absolute_port is package.module
        assert sys.modules["vllm_neuron.model.absolute_port"] is previous
        assert "vllm_neuron.model.absolute_port.config" not in sys.modules
        assert not hasattr(model_package, "absolute_port")
        del sys.modules[previous.__name__]
