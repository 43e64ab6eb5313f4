"""Layers without RoPE chosen by layer type (Cohere 2, Flint, EXAONE 4,
EXAONE-MoE): the research reads the rule from the ``if`` that guards the
rotation in the attention's forward, and the nope-layers codemod realizes
it; the tiny checkpoints hold sliding and full-attention layers, so the
validation runs both kinds (a port that rotates the full-attention layers
fails at the first of them)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("nope-layer-types")


def _code_findings(architecture: str, model_type: str, workdir: Path, **config) -> dict:
    """The code analysis' findings on the tiny checkpoint of ``architecture``
    (its config.json updated with ``config``), by field."""
    from autoport_cst.research.code_analysis import analyze_code
    from autoport_cst.research.config_analysis import analyze_config, read_config, resolve_config
    from autoport_cst.research.sources import locate_modeling_source
    from autoport_cst.validate import build_tiny_checkpoint

    directory = workdir / f"{architecture}-{len(config)}"
    build_tiny_checkpoint(architecture, directory, seed=0)
    path = directory / "config.json"
    if config:
        raw = json.loads(path.read_text(encoding="utf-8"))
        path.write_text(json.dumps({**raw, **config}), encoding="utf-8")
    raw = read_config(path)
    resolved = resolve_config(raw, str(path))
    cfg = analyze_config(raw, resolved, str(path))
    code = analyze_code(locate_modeling_source(model_type, str(path)), resolved, cfg.architecture, cfg.dims)
    return {f.field: f for f in code.findings}


@pytest.mark.parametrize(
    ("architecture", "model_type", "rule", "nope"),
    [
        ("Cohere2ForCausalLM", "cohere2", "sliding", (3,)),
        ("FlintForCausalLM", "flint", "sliding", (0, 1, 5)),
        ("Exaone4ForCausalLM", "exaone4", "sliding_or_no_window", (3,)),
        ("ExaoneMoeForCausalLM", "exaone_moe", "sliding_or_no_window", (3,)),
    ],
)
def test_the_rule_is_read_from_the_rotation_guard(architecture, model_type, rule, nope, workdir):
    found = _code_findings(architecture, model_type, workdir)
    assert found["rope.nope_layers"].value == nope
    assert found["rope.nope_rule"].value == rule
    assert "is false" in found["rope.nope_rule"].evidence  # the guard's source, quoted
    assert "unsupported.nope_layers" not in found


def test_a_guard_reading_other_config_fields_is_refused_naming_them(workdir):
    """Cohere 2 MoE also rotates the dense layers of its prefix
    (``self.force_rope``, from mlp_layer_types and
    prefix_dense_sliding_window_pattern): no rule of the codemod says that."""
    found = _code_findings("Cohere2MoeForCausalLM", "cohere2_moe", workdir)
    refusal = found["unsupported.nope_layers"]
    assert refusal.value is True
    assert "config.mlp_layer_types" in refusal.evidence
    assert "config.prefix_dense_sliding_window_pattern" in refusal.evidence
    assert "rope.nope_rule" not in found


def _edited_cohere2(workdir: Path, guard: str) -> dict:
    """The code analysis of the tiny Cohere 2 with its modeling source's
    rotation guard replaced by ``guard`` (the rest of the source as installed)."""
    import ast

    from autoport_cst.research.code_analysis import analyze_code
    from autoport_cst.research.config_analysis import analyze_config, read_config, resolve_config
    from autoport_cst.research.sources import ModelingSource, SourceModule, locate_modeling_source
    from autoport_cst.validate import build_tiny_checkpoint

    directory = workdir / "cohere2-edited"
    build_tiny_checkpoint("Cohere2ForCausalLM", directory, seed=0)
    path = directory / "config.json"
    source = locate_modeling_source("cohere2", str(path))
    text = source.module.path.read_text(encoding="utf-8")
    original = (
        "        if self.sliding_window is not None:\n            query_states, key_states = apply_rotary"
    )
    assert text.count(original) == 1
    edited = text.replace(original, original.replace("self.sliding_window is not None", guard))
    edited_path = workdir / source.module.path.name
    edited_path.write_text(edited, encoding="utf-8")
    module = SourceModule(source.module.dotted, edited_path, ast.parse(edited), source.library)
    source.library._modules[source.module.dotted] = module
    source = ModelingSource(source.library, module, source.model_type)
    raw = read_config(path)
    resolved = resolve_config(raw, str(path))
    cfg = analyze_config(raw, resolved, str(path))
    code = analyze_code(source, resolved, cfg.architecture, cfg.dims)
    return {f.field: f for f in code.findings}


def test_the_rule_does_not_come_from_the_name(workdir):
    """Cohere 2's source with a guard that also rotates on a config without
    sliding window: EXAONE 4's rule, not Cohere 2's."""
    found = _edited_cohere2(workdir, "self.sliding_window is not None or self.config.sliding_window is None")
    assert found["rope.nope_rule"].value == "sliding_or_no_window"


def test_a_guard_reading_another_field_through_the_config_is_refused(workdir):
    found = _edited_cohere2(workdir, "self.sliding_window is not None or self.config.num_hidden_layers > 99")
    assert "rope.nope_rule" not in found
    assert "config.num_hidden_layers" in found["unsupported.nope_layers"].evidence
