"""A router whose forward has a CUDA-only fast path (Kolibri 1:
``if hidden_states.is_cuda and ...: torch.mm(..., out_dtype=float32)``,
else ``F.linear`` in float32) is read on the path the code takes on CPU and
Neuron: research finds the router projection and its (absent) bias, where it
once stopped at "router projection not found" and refused the model for
``moe.router_bias``."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cuda-only-paths")


def _findings(architecture: str, model_type: str, workdir: Path) -> dict:
    from autoport_cst.research.code_analysis import analyze_code
    from autoport_cst.research.config_analysis import analyze_config, read_config, resolve_config
    from autoport_cst.research.sources import locate_modeling_source
    from autoport_cst.validate import build_tiny_checkpoint

    directory = workdir / architecture
    build_tiny_checkpoint(architecture, directory, seed=0)
    path = directory / "config.json"
    raw = read_config(path)
    resolved = resolve_config(raw, str(path))
    cfg = analyze_config(raw, resolved, str(path))
    code = analyze_code(locate_modeling_source(model_type, str(path)), resolved, cfg.architecture, cfg.dims)
    return {f.field: f for f in code.findings}


def test_the_router_is_read_on_the_cpu_path(workdir):
    found = _findings("Kolibri1ForCausalLM", "kolibri1", workdir)
    bias = found["moe.router_bias"]
    assert bias.known and bias.value is False
    assert "linear(x, weight, bias=none)" in bias.evidence
    assert found["moe.routing_bias"].value is True
