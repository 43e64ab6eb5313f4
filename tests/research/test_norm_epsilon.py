"""The norm epsilon is read by what the norm's construction passes: a config
field (the Llama family's ``eps=config.rms_norm_eps``), or a value fixed in
the code: ``nn.LayerNorm(dim)`` without ``eps`` (BioGPT, OPT: torch's
default, 1e-5, whatever config.json says) or a literal. A fixed epsilon is
the spec's ``norm.fixed_eps`` and its ``norm.eps``, and config.json's
epsilon of another value is a conflict the code wins."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("name", ["biogpt", "opt"])
def test_an_epsilon_the_code_fixes_is_read_from_the_construction(tiny, name):
    found = tiny.research(name)
    norm = found.spec.norm
    assert (norm.fixed_eps, norm.eps) == (1e-5, 1e-5)
    assert "norm.eps_key" not in found.unknown
    evidence = next(d.evidence for d in found.decisions if d.field == "norm.fixed_eps")
    assert "LayerNorm" in evidence and "fixed in the code" in evidence


def test_config_json_s_epsilon_the_code_ignores_is_a_conflict_the_code_wins(tiny):
    """BioGPT's config.json holds layer_norm_eps 1e-12; its code builds
    nn.LayerNorm(embed_dim) and never reads it."""
    found = tiny.research("biogpt")
    conflict = next(c for c in found.conflicts if c.field == "norm.eps")
    assert {(c.source, c.value) for c in conflict.claims} == {("config", 1e-12), ("code", 1e-5)}
    assert conflict.severity == "warning"


def test_an_epsilon_read_from_the_config_stays_a_config_field(tiny):
    found = tiny.research("llama")
    norm = found.spec.norm
    assert norm.fixed_eps is None
    assert norm.eps_key == "rms_norm_eps"
    config_eps = next(d.value for d in found.decisions if d.field == "norm.eps")
    assert norm.eps == config_eps
