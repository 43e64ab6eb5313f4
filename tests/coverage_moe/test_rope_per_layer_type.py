"""RoPE parameters per layer type on the MoE reference (Mellum, Laguna):
the rotary module computes its inverse frequencies for each layer type
(``compute_default_rope_parameters(config, layer_type=...)``), so the
research reads the rotary dimension per layer type. Mellum rotates whole
heads on every type and ports; Laguna's full-attention layers rotate half
of each head, a factor inside each type's RoPE parameters that no port
reads: refused, naming that."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.validation_depth import FULL, feature_depth, port_at_depth

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("rope-per-layer-type")


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


def test_the_rotary_dim_is_read_per_layer_type(workdir):
    found = _findings("MellumForCausalLM", "mellum", workdir)["rope.partial_rotary_factor"]
    assert found.known and found.value == 1.0
    assert "inv_freq over 16 of head_dim 16" in found.evidence


def test_a_partial_factor_per_layer_type_is_refused_naming_it(workdir):
    found = _findings("LagunaForCausalLM", "laguna", workdir)["rope.partial_rotary_factor"]
    assert not found.known
    assert "inv_freq over 8 of head_dim 16" in found.evidence
    assert "RoPE parameters of each layer type" in found.evidence


def _port(workdir: Path, tp: int, seed: int, depth: str = FULL):
    from autoport_cst.validate import build_tiny_checkpoint

    source = workdir / f"mellum-src{seed}"
    build_tiny_checkpoint("MellumForCausalLM", source, seed=seed)
    outcome = port_at_depth(
        depth, str(source), f"port_mellum_tp{tp}", workdir / "out", tp=tp, force=True, steps=8
    )
    assert outcome.validated, [(r.tp, r.dtype, r.first_diverging) for r in outcome.runs]
    return outcome


def test_mellum_ports_and_validates(workdir, request):
    outcome = _port(workdir, tp=1, seed=0, depth=feature_depth(request.config))
    assert [(r.tp, r.dtype) for r in outcome.runs] == [(1, "fp32"), (1, "bf16")]
    assert "partial-rotary" not in outcome.steps


@pytest.mark.slow
def test_mellum_validates_on_two_ranks(workdir):
    _port(workdir, tp=2, seed=1)
